"""Engine statistics: ``from forkless.metrics import StatLoggerBase``."""

from forkless.metrics.loggers import LoggingStatLogger, StatLoggerBase
from forkless.metrics.stats import FinishedRequestStats, IterationStats, iteration_stats

__all__ = ["FinishedRequestStats", "IterationStats", "LoggingStatLogger", "StatLoggerBase", "iteration_stats"]
