"""The platform's worker. A vLLM platform's worker is written against vLLM's worker API,
which forkless does not have: a port points ``worker_cls`` at a ``forkless.worker.Worker``
subclass instead. This one records that it ran."""

from forkless.worker.worker import Worker

from vllm_style_platform._record import record


class VllmStyleWorker(Worker):
    def init_device(self) -> None:
        super().init_device()
        record("worker.init_device", device=str(self.device))
