"""Executors: how the engine core reaches its workers (``--distributed-executor-backend``)."""

from forkless.executor.abstract import Executor, get_executor_cls

__all__ = ["Executor", "get_executor_cls"]
