"""The executor extension point (provisional): the engine core's handle on its workers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    from forkless.config import EngineConfig
    from forkless.protocol.step import ModelRunnerOutput, SchedulerOutput

@stability(Stability.PROVISIONAL)
class Executor(ABC):
    """Runs the model on one or more workers on behalf of the engine core.

    The engine core calls, in order: ``determine_num_blocks()``,
    ``initialize_cache(num_blocks)``, then ``execute_model(...)`` once per step, and
    ``shutdown()`` at the end. With ``--async-scheduling`` and
    :attr:`supports_async_scheduling` true it calls ``execute_model_async(...)`` instead,
    launching step N+1 before it calls ``collect(...)`` on step N's handle: handles are
    collected once each, in the order they were launched, and ``shutdown()`` may come
    with one still uncollected.

    Args:
        config: The engine configuration; workers are created and their models loaded
            in the constructor.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @abstractmethod
    def determine_num_blocks(self) -> int:
        """How many KV-cache blocks every worker can hold (the minimum over workers)."""

    @abstractmethod
    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` KV-cache blocks on every worker."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step and return the sampled tokens (from the driver worker)."""

    @property
    def supports_async_scheduling(self) -> bool:
        """Whether :meth:`execute_model_async` launches without waiting (default: no)."""
        return False

    @property
    def max_concurrent_batches(self) -> int:
        """How many launched batches may be in flight at once (vLLM's name): one per
        pipeline stage, so that the stages overlap. With more than one the engine core
        calls :meth:`execute_model_async` up to that many times before :meth:`collect`
        (whatever :attr:`supports_async_scheduling` says: those batches need no
        placeholders). Default: 1."""
        return 1

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> Any:
        """Launch one step; :meth:`collect` returns its output. The default runs it now."""
        return self.execute_model(scheduler_output)

    def collect(self, pending: Any) -> ModelRunnerOutput:
        """The output of a step launched by :meth:`execute_model_async`."""
        return pending

    @property
    def supports_deferred_sampling(self) -> bool:
        """Whether async steps may be planned with ``SchedulerOutput.defer_sampling``
        and sampled by :meth:`sample_deferred` (default: no; then requests with
        structured outputs keep steps synchronous)."""
        return False

    def allocate_bitmask_buffer(self, nbytes: int) -> Any:
        """A host buffer of ``nbytes`` for the engine core to fill a step's grammar bitmask
        into, which the workers read without a copy (an in-process worker's pinned memory);
        ``None`` (the default): the engine core uses a ``bytearray``. The engine core fills
        a buffer again only after the step that read it was collected, so a worker may
        read it asynchronously (a device copy queued before that step's sampling)."""
        return None

    @property
    def supports_shared_bitmask_buffer(self) -> bool:
        """Whether :meth:`allocate_shared_bitmask_buffer` gives one (default: no)."""
        return False

    def allocate_shared_bitmask_buffer(self, nbytes: int) -> tuple[str, Any] | None:
        """Like :meth:`allocate_bitmask_buffer`, but named shared memory that another
        process can map and fill (the grammar process,
        :mod:`forkless.structured_output.process`): its name and a view of its first
        ``nbytes``, which the engine core then passes to :meth:`sample_deferred` or in a
        plan. ``None`` (the default): this executor has none, and the grammars stay in
        the engine core's process."""
        return None

    def sample_deferred(self, pending: Any, grammar_bitmask: bytes | bytearray | None) -> None:
        """Sample a step launched with ``defer_sampling``, its constrained rows masked by
        ``grammar_bitmask``; called once, before :meth:`collect` and before the next
        step is launched. Only called when :attr:`supports_deferred_sampling` is true.
        The engine core reuses ``grammar_bitmask``'s buffer for the next step: use or
        send it before returning, keep a copy if it must live longer."""
        raise NotImplementedError(f"{type(self).__name__} does not sample deferred steps")

    def deferred_sample_route(self, pending: Any) -> tuple[int, list[str]] | None:
        """How another process that fills ``pending``'s bitmask in this executor's shared
        buffer (the grammar process) has the workers sample it without the engine core:
        the step's number and the addresses to send it to, one per worker, each a
        ZeroMQ PUSH peer for :func:`forkless.protocol.shared_memory.sample_message`. The
        engine core then does not call :meth:`sample_deferred` for that step (the
        workers wait for the message before they launch the next one; where several
        grammar processes each fill their rows, for all their messages, as many as each
        message's ``parts`` says). ``None`` (the default): :meth:`sample_deferred` only."""
        return None

    @property
    def routes_grammar_tokens(self) -> bool:
        """Whether the output rank's worker sends a deferred step's sampled tokens to the
        addresses its plan names (``SchedulerOutput.grammar_tokens_to``), as soon as it has
        them, before the step's output goes back (default: no; the engine core then hands
        the grammars the tokens it collected)."""
        return False

    @property
    def workers_in_process(self) -> bool:
        """Whether the workers run in this process, so that ``collective_rpc`` may be given a
        callable and ``LLM.apply_model`` a function (default: no; the ``uni`` executor: yes)."""
        return False

    def collective_rpc(self, method: str | Callable[..., Any], timeout: float | None = None,
                       args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
        """Run a worker method on every worker, as vLLM's ``collective_rpc``: ``method`` is
        the name of a public method of the worker class (``--worker-cls``), called with
        ``args`` and ``kwargs``; its results, by rank. Where the workers run in other
        processes, the arguments and results cross as msgpack (plain data only), and
        ``method`` must be a name; an in-process worker may also be given a callable,
        called with the worker first.

        Args:
            method: The method's name (or, in process, a callable).
            timeout: Seconds to wait for every worker; ``None``: no limit.
            args: Positional arguments.
            kwargs: Keyword arguments.

        Raises:
            NotImplementedError: This executor runs no worker methods by name (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} does not run worker methods by name (collective_rpc)")

    @abstractmethod
    def check_health(self) -> None:
        """Raise if a worker is dead or unhealthy."""

    def register_failure_callback(self, callback: Callable[[BaseException], None]) -> None:
        """Have ``callback(error)`` called once, from any thread, when a worker dies while the
        engine may be waiting for no call of it (an idle engine would otherwise learn of it
        only at its next step), never during :meth:`shutdown`; at once if one died
        already. Default: never called (the failure surfaces at the next call)."""

    def shutdown(self) -> None:
        """Release the workers (idempotent)."""
