"""The scheduler extension point (``--scheduler-cls``).

INTERNAL tier: it follows the engine's internals and may change in any release;
selecting a custom implementation logs a warning once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Iterable

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    from forkless.core.request import Request
    from forkless.core.sched.config import KVCacheConfig, SchedulerConfig
    from forkless.protocol.step import (
        EngineCoreOutput,
        FinishReason,
        ModelRunnerOutput,
        SchedulerOutput,
        SchedulerStats,
    )


@stability(Stability.INTERNAL)
class SchedulerInterface(ABC):
    """Decides, step after step, which tokens of which requests the model computes.

    The engine core drives it in a loop::

        output = scheduler.schedule()
        runner_output = executor.execute_model(output)
        engine_outputs = scheduler.update_from_output(output, runner_output)

    with ``add_request`` / ``finish_requests`` called between steps.

    Args:
        scheduler_config: Batching limits and policy.
        kv_cache_config: The KV cache the scheduler hands out blocks of.
    """

    #: Whether the scheduler can plan a step while the previous one is still running
    #: (async scheduling): it then accounts for tokens in flight, see
    #: :meth:`can_schedule_async`. Without it, ``--async-scheduling`` steps synchronously.
    supports_async_scheduling: ClassVar[bool] = False

    #: Whether the scheduler hosts a KV connector's scheduler side
    #: (``--kv-transfer-config``): :meth:`set_kv_connector` is then called once, before the
    #: first request. Without it, ``--kv-transfer-config`` is refused.
    supports_kv_connector: ClassVar[bool] = False

    #: Whether the scheduler can plan a batch while several earlier ones are still in
    #: flight (pipeline parallelism's micro-batches, one per stage):
    #: :meth:`set_max_concurrent_batches` is then called once, before the first request.
    #: Without it, ``-pp`` runs one batch at a time through the stages.
    supports_concurrent_batches: ClassVar[bool] = False

    @abstractmethod
    def __init__(self, scheduler_config: SchedulerConfig, kv_cache_config: KVCacheConfig) -> None:
        raise NotImplementedError

    def set_kv_connector(self, connector: Any) -> None:
        """Host ``connector``, a ``forkless.kv_transfer.KVConnectorBase`` (its scheduler
        side); only asked when :attr:`supports_kv_connector` is true."""
        raise NotImplementedError(f"{type(self).__qualname__} does not host KV connectors")

    def can_schedule_async(self) -> bool:
        """Whether the next step may be planned before the previous one's tokens are back.

        Only asked when :attr:`supports_async_scheduling` is true. Default: no.
        """
        return False

    def set_max_concurrent_batches(self, num_batches: int) -> None:
        """Told once, before the first request, when ``num_batches`` > 1 batches will be
        in flight at once: a plan must then leave out every request whose previous
        step's output is not back yet (its tokens are unknown to the first stage), and
        should take about 1 / ``num_batches`` of the requests so that the stages take
        turns. Only called when :attr:`supports_concurrent_batches` is true."""
        raise NotImplementedError(f"{type(self).__qualname__} does not plan concurrent batches")

    def set_grammar_deferred(self, deferred: bool) -> None:
        """Told once, before the first request: whether the engine core advances the
        grammars of requests with structured outputs after planning (it fills their
        bitmask while the device runs the step, ``SchedulerOutput.defer_sampling``). Then
        such requests need not keep steps synchronous. Default: ignored (a scheduler
        that does not know keeps them synchronous if it tracks history at all)."""

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue a new request.

        Args:
            request: A request in WAITING state with a unique id.

        Raises:
            ValueError: The request can never be served (e.g. its prompt does not fit
                ``max_model_len``) or its id is already in use.
        """
        raise NotImplementedError

    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Plan the next step.

        Returns:
            The batch to run; it may be empty.
        """
        raise NotImplementedError

    @abstractmethod
    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Apply the result of running ``scheduler_output``.

        Args:
            scheduler_output: The plan returned by the last :meth:`schedule`.
            runner_output: What the model runner sampled for it.

        Returns:
            One output per request that produced tokens or finished this step.
        """
        raise NotImplementedError

    def kept_tokens(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput,
                    request_ids: Iterable[str]) -> list[tuple[str, list[int]]] | None:
        """Before :meth:`update_from_output`: the tokens it will append for the step's
        sampled rows among ``request_ids`` (the engine core passes the step's
        constrained rows, ``structured_output_request_ids``), as ``(request id, tokens)`` (the grammar
        process then advances while the update runs). ``None`` when it cannot tell; the
        grammars then take the tokens after the update. Default: ``None``."""
        return None

    def take_failed_requests(self) -> list[tuple[str, str]]:
        """``(request id, reason)`` of the requests the scheduler ended as failed since
        the last call (a KV load that failed under ``kv_load_failure_policy: fail``);
        they are finished already, and their clients get the reason as a server error.
        The engine core asks after each :meth:`update_from_output`. Default: none."""
        return []

    @abstractmethod
    def finish_requests(
        self, request_ids: str | Iterable[str], finish_reason: FinishReason
    ) -> None:
        """Finish requests from outside the step loop (client abort, stop string hit).

        Unknown or already finished ids are ignored.

        Args:
            request_ids: One id or several.
            finish_reason: Recorded on the requests, usually ``FinishReason.ABORT``.
        """
        raise NotImplementedError

    @abstractmethod
    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running."""
        raise NotImplementedError

    @abstractmethod
    def get_num_unfinished_requests(self) -> int:
        """Number of requests waiting or running."""
        raise NotImplementedError

    @abstractmethod
    def make_stats(self) -> SchedulerStats:
        """A snapshot of queue lengths, KV-cache usage and cumulative counters."""
        raise NotImplementedError

    @abstractmethod
    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix.

        The engine core calls it with ``reset_running_requests=True`` (vLLM's keyword) only
        when the user asks for it (``LLM.reset_prefix_cache``): then every running request
        is preempted first, so that its KV is computed again. A scheduler that does not
        take the keyword serves every other call. (``reset_connector`` is the engine
        core's: it resets the KV connector's store itself, after this call.)

        Returns:
            Whether the cache was reset.
        """
        raise NotImplementedError
