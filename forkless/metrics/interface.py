"""The stat-logger extension point (provisional): ``StatLoggerBase``.

Invariants:
    * Stat loggers run in the API server, never in the engine core or workers; they get
      plain data (``SchedulerStats`` from :mod:`forkless.protocol.step`, ``IterationStats``).
    * ``record`` runs for every batch of engine outputs, so it must be cheap; ``log`` runs
      every ``FORKLESS_LOG_STATS_INTERVAL`` seconds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    from forkless.metrics.stats import IterationStats
    from forkless.protocol.step import SchedulerStats


@stability(Stability.PROVISIONAL)
class StatLoggerBase(ABC):
    """Receives engine statistics in the API server.

    Subclasses are loaded from the ``forkless.stat_logger_plugins`` entry-point group
    (:func:`forkless.metrics.load_stat_logger_plugin_factories`) or passed as
    ``AsyncLLM(stat_loggers=[...])``, and constructed as ``cls(vllm_config, engine_index)``:
    the signatures are vLLM's, so a vLLM stat logger ports by renaming its imports. A
    subclass may define its own ``__init__`` without calling this one.

    Args:
        vllm_config: The engine configuration (``forkless.config.EngineConfig``; named as
            in vLLM, also available as ``self.config``).
        engine_index: Which engine core the statistics come from.
    """

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.vllm_config = self.config = vllm_config
        self.engine_index = engine_index

    @abstractmethod
    def record(self, scheduler_stats: "SchedulerStats | None",
               iteration_stats: "IterationStats | None",
               mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        """Called for every batch of engine outputs (often: keep it cheap).

        Args:
            scheduler_stats: The engine core's latest snapshot, or ``None``.
            iteration_stats: Request-side numbers of this batch, or ``None``.
            mm_cache_stats: Always ``None`` (forkless serves no multimodal models; the
                argument keeps vLLM's signature).
            engine_idx: The engine core the batch came from.
        """

    @abstractmethod
    def log_engine_initialized(self) -> None:
        """Called once, when the engine is ready to serve."""

    def log(self) -> None:  # noqa: B027 - optional hook
        """Called periodically (every ``FORKLESS_LOG_STATS_INTERVAL`` seconds)."""

    def record_sleep_state(self, is_awake: int, level: int) -> None:  # noqa: B027 - optional hook
        """vLLM's sleep-mode hook; forkless has no sleep mode, so it is never called."""


# vLLM's names for what AsyncLLM(stat_loggers=[...]) accepts, so that a ported logger's
# type hints import (``from vllm.v1.metrics.loggers import StatLoggerFactory``). forkless
# builds one logger per engine core, so its factories are all of vLLM's per-engine kind.
PerEngineStatLoggerFactory = Callable[[Any, int], StatLoggerBase]
StatLoggerFactory = PerEngineStatLoggerFactory
