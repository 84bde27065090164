"""The built-in stat logger that writes periodic log lines (Prometheus: ``prometheus.py``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from forkless.logger import init_logger
from forkless.metrics.interface import StatLoggerBase

if TYPE_CHECKING:
    from forkless.metrics.stats import IterationStats
    from forkless.protocol.step import SchedulerStats

logger = init_logger("forkless.metrics")


class LoggingStatLogger(StatLoggerBase):
    """Logs throughput, queue sizes, KV-cache usage and prefix-cache hit rate."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        super().__init__(vllm_config, engine_index)
        self._reset(time.monotonic())
        self.last_scheduler_stats: SchedulerStats | None = None
        self._last_queries = self._last_hits = 0
        self._last_drafts = self._last_accepted = 0

    def _reset(self, now: float) -> None:
        self.last_log_time = now
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0

    def record(self, scheduler_stats: "SchedulerStats | None",
               iteration_stats: "IterationStats | None",
               mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        if iteration_stats is not None:
            self.num_prompt_tokens += iteration_stats.num_prompt_tokens
            self.num_generation_tokens += iteration_stats.num_generation_tokens
        if scheduler_stats is not None:
            self.last_scheduler_stats = scheduler_stats

    def log(self) -> None:
        now = time.monotonic()
        elapsed = max(now - self.last_log_time, 1e-9)
        s = self.last_scheduler_stats
        idle = not (self.num_prompt_tokens or self.num_generation_tokens) and (
            s is None or (s.num_running == 0 and s.num_waiting == 0))
        if idle:  # an idle server should not fill its log
            self.last_log_time = now
            return
        queries = (s.prefix_cache_queries - self._last_queries) if s else 0
        hits = (s.prefix_cache_hits - self._last_hits) if s else 0
        if s is not None:
            self._last_queries, self._last_hits = s.prefix_cache_queries, s.prefix_cache_hits
        logger.info(
            "engine %d: prompt throughput %.1f tokens/s, generation throughput %.1f tokens/s, "
            "running %d, waiting %d, KV cache usage %.1f%%, prefix cache hit rate %.1f%%",
            self.engine_index, self.num_prompt_tokens / elapsed,
            self.num_generation_tokens / elapsed, s.num_running if s else 0,
            s.num_waiting if s else 0, 100 * (s.kv_cache_usage if s else 0.0),
            100 * hits / queries if queries else 0.0,
        )
        spec = s.spec_decode if s is not None else None
        if spec is not None and spec.num_drafts > self._last_drafts:
            drafts = spec.num_drafts - self._last_drafts
            accepted = spec.num_accepted_tokens - self._last_accepted
            # vLLM's figure: tokens a verified draft sequence yields, its own token included.
            logger.info("engine %d: speculative decoding: mean acceptance length %.2f over %d drafts",
                        self.engine_index, 1 + accepted / drafts, drafts)
            self._last_drafts, self._last_accepted = spec.num_drafts, spec.num_accepted_tokens
        self._reset(now)

    def log_engine_initialized(self) -> None:
        logger.info("engine %d initialized", self.engine_index)
