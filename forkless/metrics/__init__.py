"""Engine statistics: ``from forkless.metrics import StatLoggerBase``."""

from forkless.metrics.interface import PerEngineStatLoggerFactory, StatLoggerBase, StatLoggerFactory
from forkless.metrics.loggers import LoggingStatLogger
from forkless.metrics.registry import load_stat_logger_plugin_factories, make_stat_logger
from forkless.metrics.stats import (FinishedRequestStats, IntervalViews, IterationStats, PrefixCacheStats,
                                    SchedulerStats, iteration_stats)

__all__ = [
    "FinishedRequestStats",
    "IntervalViews",
    "IterationStats",
    "LoggingStatLogger",
    "PerEngineStatLoggerFactory",
    "PrefixCacheStats",
    "SchedulerStats",
    "StatLoggerBase",
    "StatLoggerFactory",
    "iteration_stats",
    "load_stat_logger_plugin_factories",
    "make_stat_logger",
]
