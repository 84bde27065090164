"""An executor that runs one worker in the engine core's process and counts the steps."""

import logging

from forkless.executor import Executor
from forkless.worker.worker import create_worker

logger = logging.getLogger("forkless.example_executor")


class StepCountingExecutor(Executor):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.steps = 0
        self.worker = create_worker(config, rank=0)  # the platform's worker class
        self.worker.init_device()
        self.worker.load_model()

    def determine_num_blocks(self) -> int:
        return self.worker.determine_num_blocks()

    def initialize_cache(self, num_blocks: int) -> None:
        self.worker.initialize_cache(num_blocks)

    def execute_model(self, scheduler_output):
        self.steps += 1
        return self.worker.execute_model(scheduler_output)

    def check_health(self) -> None:
        self.worker.check_health()

    def shutdown(self) -> None:
        if self.worker is not None:
            logger.warning("StepCountingExecutor: %d steps", self.steps)
            self.worker.shutdown()
            self.worker = None
