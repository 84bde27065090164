"""Engine statistics: ``from forkless.metrics import StatLoggerBase``."""

from forkless.metrics.interface import StatLoggerBase
from forkless.metrics.loggers import LoggingStatLogger
from forkless.metrics.registry import load_stat_logger_plugin_factories, make_stat_logger
from forkless.metrics.stats import FinishedRequestStats, IterationStats, iteration_stats

__all__ = [
    "FinishedRequestStats",
    "IterationStats",
    "LoggingStatLogger",
    "StatLoggerBase",
    "iteration_stats",
    "load_stat_logger_plugin_factories",
    "make_stat_logger",
]
