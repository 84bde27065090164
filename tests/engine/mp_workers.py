"""Worker classes selected by path (``parallel_config.worker_cls``) in the ``mp`` executor
tests: they run in the spawned worker process, which imports them from ``tests``."""

from __future__ import annotations

from typing import Any

from forkless.worker.worker import Worker

# The async step (counted from 1) in which the failing workers raise: late enough that
# steps have been overlapped (one in flight) before it.
FAIL_AT_STEP = 4


class FailOnLaunch(Worker):
    """Raises while launching async step ``FAIL_AT_STEP``."""

    launched = 0

    def execute_model_async(self, scheduler_output) -> Any:  # type: ignore[no-untyped-def]
        type(self).launched += 1
        if type(self).launched == FAIL_AT_STEP:
            raise RuntimeError(f"injected launch failure in async step {FAIL_AT_STEP}")
        return super().execute_model_async(scheduler_output)


class FailOnCollect(Worker):
    """Raises while collecting async step ``FAIL_AT_STEP``."""

    collected = 0

    def collect(self, pending: Any):  # type: ignore[no-untyped-def]
        type(self).collected += 1
        if type(self).collected == FAIL_AT_STEP:
            raise RuntimeError(f"injected collect failure in async step {FAIL_AT_STEP}")
        return super().collect(pending)


class NoAsyncWorker(Worker):
    """A worker whose runner may not overlap steps (as with a custom logits processor)."""

    @property
    def supports_async_scheduling(self) -> bool:
        return False


class RpcWorker(Worker):
    """Methods for ``LLM.collective_rpc`` to call by name in worker processes."""

    def echo(self, value: Any, scale: int = 1) -> dict[str, Any]:
        return {"rank": self.rank, "value": value * scale}

    def pause(self, seconds: float) -> float:
        import time

        time.sleep(seconds)
        return seconds

    def device_handle(self) -> Any:
        return self.device  # a torch.device: not plain data
