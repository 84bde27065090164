"""Scheduling: the ``SchedulerInterface`` extension point and its default implementation."""

from forkless.core.sched.config import KVCacheConfig, SchedulerConfig
from forkless.core.sched.registry import get_scheduler_cls
from forkless.core.sched.interface import SchedulerInterface
from forkless.protocol.step import (
    EngineCoreOutput,
    ModelRunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
    SchedulerStats,
)
from forkless.core.sched.scheduler import Scheduler

__all__ = [
    "EngineCoreOutput",
    "KVCacheConfig",
    "ModelRunnerOutput",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerInterface",
    "SchedulerOutput",
    "SchedulerStats",
    "get_scheduler_cls",
]
