"""Executors: how the engine core reaches its workers (``--distributed-executor-backend``)."""

from forkless.executor.interface import Executor
from forkless.executor.registry import available_executors, get_executor_cls, register_executor

__all__ = ["Executor", "available_executors", "get_executor_cls", "register_executor"]
