"""The attention-backend interface and the per-step metadata every backend reads.

This module must not import torch at runtime: the registry (and so this base class) is
imported by processes that only validate ``--attention-backend`` and never attend.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    import torch


@dataclass
class AttentionMetadata:
    """What one forward step's attention needs to know about the flattened token batch.

    The batch holds ``B`` sequences whose new tokens are concatenated into ``T`` rows
    (``T`` may exceed ``query_start_loc[-1]`` when the runner pads the batch; rows past
    it are padding). The new tokens of a sequence are always its *last* ``q_len``
    positions, so one layout covers prefill, prefill on top of a prefix-cache hit,
    chunked prefill and decode.

    Attributes:
        slot_mapping: ``[T]`` int64. KV-cache slot of each new token,
            ``block_id * block_size + offset_in_block``; ``-1`` means "do not store"
            (padding).
        query_start_loc: ``[B + 1]`` int32. Cumulative new-token counts: sequence ``i``
            owns rows ``query_start_loc[i]:query_start_loc[i + 1]``.
        seq_lens: ``[B]`` int32. Tokens of each sequence after this step (already
            cached context + new tokens).
        block_tables: ``[B, max_blocks]`` int32. Block ids of each sequence, in order;
            entries past the sequence's last block are padding (0 or -1).
        max_query_len: Largest new-token count in the batch.
        max_seq_len: Largest ``seq_lens`` entry.
        block_size: Tokens per KV-cache block.
        query_start_loc_cpu: Optional host copy of ``query_start_loc``, so backends that
            plan on the host need not synchronise with the device.
        seq_lens_cpu: Optional host copy of ``seq_lens``.
        backend_state: Scratch space in which a backend caches what it derives from this
            metadata once per step (every layer sees the same metadata object).
    """

    slot_mapping: "torch.Tensor"
    query_start_loc: "torch.Tensor"
    seq_lens: "torch.Tensor"
    block_tables: "torch.Tensor"
    max_query_len: int
    max_seq_len: int
    block_size: int
    query_start_loc_cpu: "torch.Tensor | None" = None
    seq_lens_cpu: "torch.Tensor | None" = None
    backend_state: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_seqs(self) -> int:
        """``B``, the number of sequences in the batch."""
        return int(self.seq_lens.shape[0])

    @property
    def num_actual_tokens(self) -> int:
        """New tokens that belong to a sequence (the rest of ``T`` is padding)."""
        loc = self.query_start_loc_cpu if self.query_start_loc_cpu is not None else self.query_start_loc
        return int(loc[-1])


class KVStoreTarget(NamedTuple):
    """Where a kernel that produces a layer's keys may also store them with their values,
    instead of the backend's :meth:`~AttentionBackend.forward` (one launch fewer a layer).

    Attributes:
        cache: The layer's cache, ``(2, num_blocks, block_size, Hkv, D)`` (keys, values).
        slot_mapping: ``[T]`` cache slot of each new token; ``-1``: do not store.
        k_inv_scale: ``1 / k_scale`` of an fp8 cache (keys are stored multiplied by it).
        v_inv_scale: ``1 / v_scale``, the same for values.
    """

    cache: "torch.Tensor"
    slot_mapping: "torch.Tensor"
    k_inv_scale: float
    v_inv_scale: float


@stability(Stability.PROVISIONAL)
class AttentionBackend(abc.ABC):
    """An attention implementation over the paged KV cache (provisional interface).

    A model builds one backend instance per attention layer and calls :meth:`forward`
    with that layer's projected, rotary-embedded q/k/v. Per-layer state (for example a
    sliding window, or kernel workspaces) therefore lives on the instance, while the
    cache layout is a class-level decision the model runner asks for through
    :meth:`get_kv_cache_shape` before any model exists.

    Register a subclass with ``register_attention_backend(name, "pkg.mod:Class")`` and
    select it with ``--attention-backend NAME``.

    Args:
        num_heads: Query heads ``Hq`` of the layer.
        num_kv_heads: Key/value heads ``Hkv``; ``Hq`` is a multiple of it (GQA/MQA).
        head_dim: Size ``D`` of one head.
        scale: Softmax scale applied to ``q @ k^T`` (usually ``D ** -0.5``).
        layer_idx: Index of the layer, for backends that keep per-layer state.
    """

    #: The name the backend is registered and selected under.
    name: ClassVar[str] = ""
    #: Whether a decode step's forward pass may be captured in a CUDA graph (the backend
    #: then reads everything it needs from the metadata's device tensors).
    supports_cuda_graphs: ClassVar[bool] = False
    #: Whether a prefill or mixed step may be captured in pieces: CUDA graphs of the layers
    #: between attention calls, with :meth:`forward_stored` run eagerly between their
    #: replays (``forkless.attention.piecewise``). The backend then hands its
    #: ``forward_stored`` calls to :func:`~forkless.attention.piecewise.active_splitter`
    #: while one is installed, and writes into ``output`` when given.
    supports_piecewise_graphs: ClassVar[bool] = False
    #: The ``--kv-cache-dtype`` values the backend reads and writes. ``"auto"``: the cache
    #: holds the model dtype; ``"fp8"`` / ``"fp8_e4m3"``: float8 e4m3 holding ``x / scale``
    #: with the layer's :attr:`k_scale` / :attr:`v_scale`.
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        layer_idx: int = 0,
    ) -> None:
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.layer_idx = layer_idx
        #: Per-tensor scales of an fp8 KV cache (stored = x / scale). forkless, like vLLM
        #: without checkpoint scales or ``--calculate-kv-scales``, uses 1.0.
        self.k_scale = 1.0
        self.v_scale = 1.0

    @classmethod
    @abc.abstractmethod
    def get_kv_cache_shape(
        cls, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        """The shape of one layer's KV-cache tensor for this backend.

        Args:
            num_blocks: Blocks in the cache.
            block_size: Tokens per block.
            num_kv_heads: Key/value heads per token.
            head_dim: Size of one head.

        Returns:
            The shape the model runner allocates (in the model dtype) for each layer.
        """

    @abc.abstractmethod
    def forward(
        self,
        q: "torch.Tensor",
        k: "torch.Tensor",
        v: "torch.Tensor",
        kv_cache: "torch.Tensor | None",
        attn_metadata: AttentionMetadata,
    ) -> "torch.Tensor":
        """Store the new keys/values in the paged cache, then attend causally.

        Args:
            q: ``[T, Hq, D]`` queries of the new tokens.
            k: ``[T, Hkv, D]`` keys of the new tokens.
            v: ``[T, Hkv, D]`` values of the new tokens.
            kv_cache: This layer's cache, shaped by :meth:`get_kv_cache_shape`; ``None``
                or empty during a profiling run without a cache (then no sequence may
                have cached context).
            attn_metadata: The step's batch layout.

        Returns:
            ``[T, Hq * D]`` attention output (rows of padding tokens are unspecified).
        """

    def kv_store_target(self, kv_cache: "torch.Tensor | None",
                        attn_metadata: AttentionMetadata) -> KVStoreTarget | None:
        """Where the caller may store this step's new keys and values itself, or ``None``.

        A backend that returns a target has the ``(2, num_blocks, block_size, Hkv, D)``
        layout, implements :meth:`forward_stored`, and is then called through it when the
        model's rotary kernel stored the keys and values (the built-in Llama-family
        attention on CUDA). The default, ``None``: the backend stores them in
        :meth:`forward`.
        """
        return None

    def forward_stored(self, q: "torch.Tensor", kv_cache: "torch.Tensor",
                       attn_metadata: AttentionMetadata, output: "torch.Tensor | None" = None) -> "torch.Tensor":
        """:meth:`forward` without the store: the new keys and values are already in
        ``kv_cache`` at ``attn_metadata.slot_mapping`` (see :meth:`kv_store_target`).

        Args:
            q: ``[T, Hq, D]`` queries of the new tokens.
            kv_cache: This layer's cache.
            attn_metadata: The step's batch layout.
            output: ``[T, Hq, D]`` contiguous tensor to write the result into (piecewise
                CUDA graphs pass one whose address their replays read); ``None``: a new one.

        Returns:
            ``[T, Hq * D]`` attention output, as :meth:`forward` (a view of ``output``
            when given).
        """
        raise NotImplementedError(f"{type(self).__name__} returns a kv_store_target but does not "
                                  "implement forward_stored")


def attention_layers(model: Any) -> list[tuple[str, AttentionBackend]]:
    """A model's attention backends with their module paths (``model.layers.0.self_attn.attn``),
    in module order.

    Args:
        model: A ``torch.nn.Module`` whose modules hold backends as attributes.
    """
    found = []
    for path, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, AttentionBackend):
                found.append((f"{path}.{attr}" if path else attr, value))
    return found
