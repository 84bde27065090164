"""Registers the ``counting`` executor: ``--distributed-executor-backend counting``."""


def register() -> None:
    from forkless.executor import register_executor

    register_executor("counting", "forkless_example_executor.executor:StepCountingExecutor")
