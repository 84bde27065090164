"""The in-process executor: one worker, called directly (``--distributed-executor-backend uni``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from forkless.executor.interface import Executor
from forkless.protocol.shared_memory import BitmaskSegments
from forkless.worker.worker import call_worker_method, create_worker

if TYPE_CHECKING:
    from forkless.config import EngineConfig
    from forkless.protocol.step import ModelRunnerOutput, SchedulerOutput


class UniProcExecutor(Executor):
    """Runs the platform's worker class in the engine core's own process.

    Args:
        config: The engine configuration.
    """

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        if config.parallel_config.world_size != 1:
            raise ValueError(f"the uni executor runs one worker, and this configuration has "
                             f"{config.parallel_config.world_size}: use --distributed-executor-backend mp")
        # The grammar process's bitmask segments (allocate_shared_bitmask_buffer).
        self._segments: BitmaskSegments | None = None
        self.worker = create_worker(config, rank=0)
        self.worker.init_device()
        self.worker.load_model()

    def determine_num_blocks(self) -> int:
        return self.worker.determine_num_blocks()

    def initialize_cache(self, num_blocks: int) -> None:
        self.worker.initialize_cache(num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(scheduler_output)

    @property
    def supports_async_scheduling(self) -> bool:
        return self.worker.supports_async_scheduling

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> Any:
        return self.worker.execute_model_async(scheduler_output)

    def collect(self, pending: Any) -> ModelRunnerOutput:
        return self.worker.collect(pending)

    @property
    def supports_deferred_sampling(self) -> bool:
        return self.worker.supports_async_scheduling

    def sample_deferred(self, pending: Any, grammar_bitmask: bytes | bytearray | None) -> None:
        self.worker.sample_deferred(pending, grammar_bitmask)

    def allocate_bitmask_buffer(self, nbytes: int) -> Any:
        return self.worker.allocate_host_buffer(nbytes)

    @property
    def supports_shared_bitmask_buffer(self) -> bool:
        return True

    def allocate_shared_bitmask_buffer(self, nbytes: int) -> tuple[str, memoryview]:
        # Pinned where the worker can (CUDA): it copies the bitmask to the device in place.
        if self._segments is None:
            worker = self.worker
            self._segments = BitmaskSegments(worker.register_host_buffer, worker.unregister_host_buffer)
        return self._segments.view(nbytes)

    @property
    def workers_in_process(self) -> bool:
        return True

    def collective_rpc(self, method: str | Callable[..., Any], timeout: float | None = None,
                       args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
        """The worker's answer, called in this thread (a callable too: nothing crosses a process).

        Raises:
            ValueError: A ``timeout``: a call in this thread cannot be cut short.
        """
        if timeout is not None:
            raise ValueError(f"collective_rpc timeout={timeout!r}: the uni executor calls its worker in this "
                             "thread, which cannot be interrupted; use distributed_executor_backend='mp' for "
                             "a timeout, or leave it None")
        return [call_worker_method(self.worker, method, args, kwargs)]

    def check_health(self) -> None:
        self.worker.check_health()

    def shutdown(self) -> None:
        worker, self.worker = getattr(self, "worker", None), None
        segments, self._segments = getattr(self, "_segments", None), None
        if segments is not None:
            segments.close()
        if worker is not None:
            worker.shutdown()
