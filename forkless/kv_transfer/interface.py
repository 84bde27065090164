"""The KV connector interface (provisional tier): vLLM v1's split into a scheduler side
and a worker side, one class for both.

The engine builds the class twice: once with ``KVConnectorRole.SCHEDULER`` in the engine
core, next to the scheduler, and once with ``KVConnectorRole.WORKER`` in every worker,
next to the KV cache. Each step:

1. scheduler side, while a waiting request is admitted (no blocks yet):
   :meth:`~KVConnectorBase.get_num_new_matched_tokens` says how many tokens past the
   local prefix-cache hit the connector can supply, and whether it loads them
   asynchronously; once blocks are allocated, :meth:`~KVConnectorBase.update_state_after_alloc`
   learns which. At the end of ``schedule()``,
   :meth:`~KVConnectorBase.build_connector_meta` turns the step into metadata;
2. worker side: the metadata is bound (:meth:`~KVConnectorBase.bind_connector_metadata`),
   :meth:`~KVConnectorBase.handle_preemptions` and :meth:`~KVConnectorBase.start_load_kv`
   run before the forward pass, :meth:`~KVConnectorBase.wait_for_layer_load` and
   :meth:`~KVConnectorBase.save_kv_layer` around every attention layer, then
   :meth:`~KVConnectorBase.wait_for_save` and :meth:`~KVConnectorBase.get_finished` after
   it; what ended travels back in ``ModelRunnerOutput.kv_connector_output``;
3. scheduler side: a finished request goes through :meth:`~KVConnectorBase.request_finished`
   before its blocks are freed, and may keep them until its saves end.

Outside the step, ``LLM.reset_prefix_cache(reset_connector=True)`` empties the connector's
store: the engine core first has every worker side finish the saves it started
(:meth:`~KVConnectorBase.wait_for_pending_saves`), then calls the scheduler side's
:meth:`~KVConnectorBase.reset_cache` (vLLM's hook, by the same name).

Invariants:
    * The metadata crosses the process boundary as msgpack (msgspec), never pickle: it
      must be an instance of the class's :attr:`KVConnectorBase.metadata_cls` (a
      dataclass or ``msgspec.Struct`` of plain fields), which the worker side decodes.
    * Tokens a connector claims are never the request's last prompt token: computing it
      is what yields the first output token. The scheduler trims a larger claim.
    * A block a request is loading into, or that an asynchronous save still reads, is
      not freed until the worker reports the request in ``finished_recving`` /
      ``finished_sending`` (when ``request_finished`` returned True).
    * A failed load is never silent: the worker side reports the block ids
      (:meth:`KVConnectorBase.get_block_ids_with_load_errors`) and the scheduler
      recomputes from the first failed block.
    * Once :meth:`KVConnectorBase.reset_cache` returned True, no request admitted later
      loads anything that was in the store before the call, and no save started before
      it lands after it.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterable

from forkless.logger import init_logger
from forkless.plugins import Stability, stability
from forkless.protocol.kv_transfer import BlockIds

if TYPE_CHECKING:
    import torch

    from forkless.attention.interface import AttentionMetadata
    from forkless.core.request import Request
    from forkless.core.sched.config import KVCacheConfig
    from forkless.protocol.kv_transfer import KVConnectorOutput, KVTransferStats
    from forkless.protocol.step import SchedulerOutput

logger = init_logger(__name__)


class KVConnectorRole(enum.Enum):
    """Which side of the connector an instance is."""

    #: In the engine core, next to the scheduler.
    SCHEDULER = 0
    #: In a worker, next to the KV cache.
    WORKER = 1


@dataclass
class KVConnectorMetadata:
    """What the scheduler side tells the worker side for one step; subclass it (as a
    dataclass of plain fields) and name the subclass in :attr:`KVConnectorBase.metadata_cls`."""


@dataclass
class ForwardContext:
    """What :meth:`KVConnectorBase.start_load_kv` gets about the step's forward pass.

    Attributes:
        kv_caches: Layer name (``model.layers.0.self_attn.attn``) -> that layer's cache.
            (Unlike vLLM's, it has no attention metadata: the loads start before the
            step's inputs are prepared; the layer hooks get the metadata.)
    """

    kv_caches: dict[str, "torch.Tensor"]


@stability(Stability.PROVISIONAL)
class KVConnectorBase(abc.ABC):
    """Moves KV-cache blocks between this engine and somewhere else (provisional).

    Args:
        config: The engine configuration (``forkless.config.EngineConfig``);
            ``config.kv_transfer_config`` is set.
        role: Which side this instance is.
        kv_cache_config: The scheduler's KV cache (block count and size); ``None`` on
            the worker side.

    Attributes:
        metadata_cls: The type :meth:`build_connector_meta` returns, which the worker
            side decodes the step's metadata into.
        requires_layer_hooks_in_decode: Whether :meth:`wait_for_layer_load` and
            :meth:`save_kv_layer` must run in every step. A decode step replayed from a
            CUDA graph does not call them, so True turns CUDA graphs off; a connector
            that only moves prompt blocks (computed in eager prefill steps) and does its
            work in :meth:`start_load_kv` / :meth:`wait_for_save` leaves it False.
    """

    metadata_cls: ClassVar[type] = KVConnectorMetadata
    requires_layer_hooks_in_decode: ClassVar[bool] = True

    def __init__(self, config: Any = None, role: KVConnectorRole | None = None,
                 kv_cache_config: KVCacheConfig | None = None, *, vllm_config: Any = None) -> None:
        # vLLM's connectors call super().__init__(vllm_config=..., role=..., kv_cache_config=...).
        if (config is None) == (vllm_config is None):
            raise TypeError(f"{type(self).__name__}: give the engine configuration once, as config "
                            "(or vLLM's keyword, vllm_config)")
        config = config if config is not None else vllm_config
        if role is None:
            raise TypeError(f"{type(self).__name__}: role (a KVConnectorRole) is required")
        assert config.kv_transfer_config is not None
        self._config = config
        self._vllm_config = config  # vLLM's attribute name, read by ported connectors
        self._kv_transfer_config = config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role
        self._connector_metadata: Any = None

    @classmethod
    def check_config(cls, kv_transfer_config: Any) -> None:
        """Refuse a ``KVTransferConfig`` this connector cannot work with, where the flag is
        given (before any engine process starts). Default: accept.

        Raises:
            ValueError: Naming the bad key, its value and what was expected.
        """

    @property
    def role(self) -> KVConnectorRole:
        """Which side this instance is."""
        return self._role

    # ------------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        """Receive the KV cache once it is allocated: layer name -> that layer's tensor,
        shaped ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (keys, values).
        Default: nothing."""

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        """Set the step's metadata (the runner calls this before the forward pass)."""
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        """Drop the step's metadata (the runner calls this after the forward pass)."""
        self._connector_metadata = None

    def has_connector_metadata(self) -> bool:
        """Whether a step's metadata is bound."""
        return self._connector_metadata is not None

    def _get_connector_metadata(self) -> Any:
        """The bound metadata (only between bind and clear)."""
        assert self._connector_metadata is not None, "no connector metadata is bound"
        return self._connector_metadata

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        """Before the step's forward pass overwrites anything: finish whatever still reads
        blocks the scheduler has just freed (preempted requests'). Default: nothing."""

    @abc.abstractmethod
    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Start (or do) the step's loads into the KV cache, before the forward pass."""
        raise NotImplementedError

    @abc.abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        """Block until the loads of ``layer_name`` are in the cache (before its attention)."""
        raise NotImplementedError

    @abc.abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor", attn_metadata: "AttentionMetadata",
                      **kwargs: Any) -> None:
        """Start saving from ``layer_name``'s cache, right after its attention stored the
        step's new keys and values."""
        raise NotImplementedError

    @abc.abstractmethod
    def wait_for_save(self) -> None:
        """After the forward pass: block until the step's saves no longer need the cache
        (an asynchronous save may have copied what it needs and go on writing)."""
        raise NotImplementedError

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """After every step: ``(ids whose saves ended, ids whose loads ended)``.

        Args:
            finished_req_ids: Requests that finished since the previous step. A request
                whose blocks the scheduler kept (``request_finished`` returned True) is
                reported in the first set once its saves end, in this call or a later one.

        Returns:
            The two sets (``None``: empty). Default: nothing asynchronous.
        """
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose load failed since the last call (their requests recompute them).
        Default: none."""
        return set()

    def get_kv_connector_stats(self) -> KVTransferStats | None:
        """What the transfers moved since the last call (for the metrics). Default: ``None``."""
        return None

    def wait_for_pending_saves(self) -> None:
        """Block until every save this worker side started has ended (in the store, or
        dropped), between steps. The engine core calls it on every worker before the
        scheduler side's :meth:`reset_cache`, so that no save started before a reset
        writes into the store after it. (forkless's hook; vLLM has none.) Default: nothing,
        right for a connector whose saves end in :meth:`wait_for_save`."""

    def shutdown(self) -> None:
        """Release threads and connections (the worker is stopping). Default: nothing."""

    # --------------------------------------------------------------- scheduler side

    def on_new_request(self, request: Request) -> None:
        """A request was added to the scheduler. Default: nothing."""

    @abc.abstractmethod
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """How many of the request's tokens past ``num_computed_tokens`` the connector can
        supply, at admission.

        Args:
            request: A waiting request without blocks.
            num_computed_tokens: Tokens the local prefix cache already has (a multiple of
                the block size).

        Returns:
            ``(tokens, load_async)``. ``tokens`` ``None``: not known yet, ask again at a
            later step. ``load_async``: the tokens arrive between steps (the request waits
            in ``WAITING_FOR_REMOTE_KVS`` until the worker reports it in
            ``finished_recving``); False: they are in the cache before the step's forward
            pass. Must be False when ``tokens`` is 0.
        """
        raise NotImplementedError

    @abc.abstractmethod
    def update_state_after_alloc(self, request: Request, block_ids: list[int], num_external_tokens: int) -> None:
        """Blocks were allocated for an admitted request.

        Args:
            request: The request.
            block_ids: Its whole block table: the local hits, then the blocks for the
                ``num_external_tokens`` tokens to load, then those to compute (a
                :class:`~forkless.protocol.kv_transfer.BlockIds`: a list, with vLLM's
                ``get_block_ids()`` too).
            num_external_tokens: Tokens to load (0: none; the call still tells a connector
                that the request was admitted).
        """
        raise NotImplementedError

    @abc.abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> Any:
        """The step's metadata for the worker side (an instance of :attr:`metadata_cls`).
        Called once per step, after the step is planned; it must not change the plan."""
        raise NotImplementedError

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """What the workers reported for a step. Default: nothing."""

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """A request finished (or was aborted), before its blocks are freed.

        Returns:
            ``(keep_blocks, kv_transfer_params)``: True keeps the blocks until a worker
            reports the request in ``finished_sending``. ``kv_transfer_params`` (a dict
            of plain data, or ``None``) goes back to the client in the request's last
            output (``RequestOutput.kv_transfer_params``, the response's field of the same
            name), for the engine that continues the request; the client's own come in
            ``request.kv_transfer_params``. Not for a request aborted or ended by a stop
            string (it has no last output from the engine). Default: ``(False, None)``.
        """
        return False, None

    def reset_cache(self) -> bool | None:
        """Empty the connector's store (scheduler side), as vLLM's
        ``KVConnectorBase_V1.reset_cache``: ``LLM.reset_prefix_cache(reset_connector=True)``
        calls it, between steps, after the local prefix cache is reset and every worker
        side's :meth:`wait_for_pending_saves` has returned. After True, no later request
        may load what the store held (its prompt is computed instead), and any index the
        connector keeps of what is stored must be emptied too.

        Returns:
            True: emptied; False: it failed (``reset_prefix_cache`` then returns False);
            ``None``: not implemented, which ``reset_prefix_cache`` counts as success, as
            vLLM does. Default: logs (at debug level) that the connector does not
            implement it and returns ``None``.
        """
        logger.debug("KV connector cache reset requested, but %s does not implement reset_cache()",
                     type(self).__name__)
        return None

    def take_events(self) -> Iterable[Any]:
        """KV-cache events since the last call (vLLM's hook; forkless publishes none yet).
        Default: none."""
        return ()
