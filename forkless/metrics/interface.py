"""The stat-logger extension point (provisional): ``StatLoggerBase``.

Invariants:
    * Stat loggers run in the API server, never in the engine core or workers; they get
      plain data (``SchedulerStats`` from :mod:`forkless.protocol.step`, ``IterationStats``).
    * ``record`` runs for every batch of engine outputs, so it must be cheap; ``log`` runs
      every ``FORKLESS_LOG_STATS_INTERVAL`` seconds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    from forkless.metrics.stats import IterationStats
    from forkless.protocol.step import SchedulerStats


@stability(Stability.PROVISIONAL)
class StatLoggerBase(ABC):
    """Receives engine statistics in the API server.

    Subclasses are loaded from the ``forkless.stat_logger_plugins`` entry-point group or
    passed as ``AsyncLLM(stat_loggers=[...])``, and constructed as ``cls(config,
    engine_index=0)``.

    Args:
        config: The engine configuration (``forkless.config.EngineConfig``).
        engine_index: Which engine core the statistics come from.
    """

    def __init__(self, config: Any, engine_index: int = 0) -> None:
        self.config = config
        self.engine_index = engine_index

    @abstractmethod
    def record(self, scheduler_stats: "SchedulerStats | None",
               iteration_stats: "IterationStats | None") -> None:
        """Called for every batch of engine outputs (often: keep it cheap)."""

    @abstractmethod
    def log_engine_initialized(self) -> None:
        """Called once, when the engine is ready to serve."""

    def log(self) -> None:  # noqa: B027 - optional hook
        """Called periodically (every ``FORKLESS_LOG_STATS_INTERVAL`` seconds)."""
