"""What the API server measures per batch of engine outputs.

Scheduler-side numbers (running / waiting requests, KV usage, prefix-cache counters)
come from the engine core as ``SchedulerStats``; request-side latencies are measured in
the API server, where the client's clock is, except a request's phases (queued, prefill,
decode, inference), measured between the engine core's event and step times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# Where vLLM's stat loggers import it from (vllm.v1.metrics.stats); it crosses processes,
# so it lives in the protocol package.
from forkless.protocol.step import FinishReason, PrefixCacheStats, SchedulerStats, SpecDecodeStats

__all__ = ["FinishedRequestStats", "IntervalViews", "IterationStats", "MultiModalCacheStats", "PrefixCacheStats",
           "RequestStateStats", "RequestTiming", "SchedulerStats", "iteration_stats"]


@dataclass
class MultiModalCacheStats:
    """vLLM's multimodal-cache counters, the type of ``StatLoggerBase.record``'s
    ``mm_cache_stats``: forkless serves no multimodal models and always passes ``None``,
    so a ported logger's annotation imports and its ``None`` check holds."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0


@dataclass
class RequestStateStats:
    """One request's statistics so far, as vLLM's (``RequestOutput.metrics`` of the offline
    ``LLM(disable_log_stats=False)`` and of ``AsyncLLM`` with statistics on).

    Two clocks, as in vLLM: ``arrival_time`` is the caller's wall clock (``time.time()``);
    the ``*_ts`` fields are the engine core's ``time.monotonic()``, comparable with one
    another but not with ``arrival_time``. A field not reached yet is 0.

    Attributes:
        num_generation_tokens: Tokens the engine generated for the request.
        arrival_time: When the request arrived (wall clock).
        queued_ts: When the engine core queued it.
        scheduled_ts: When it was first scheduled (a readmission after a preemption
            leaves it as it was).
        first_token_ts: When the step that made its first token ended.
        last_token_ts: When the step that made its latest token ended.
        first_token_latency: Seconds from arrival to the first token (wall clock).
        is_corrupted: vLLM's flag for NaNs in the logits; forkless does not count
            them, so it stays ``False``.
    """

    num_generation_tokens: int = 0
    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    first_token_latency: float = 0.0
    is_corrupted: bool = False


@dataclass
class RequestTiming:
    """Lifecycle of one finished completion, for metrics (``time.time()`` seconds).

    Attributes:
        request_id: The engine-core request id (a child id for ``n > 1``).
        parent_id: The user-visible request id.
        arrival_time: When the request arrived.
        first_token_time: When its first token came back, or ``None``.
        last_token_time: When its last token came back, or ``None``.
        num_prompt_tokens: Prompt length.
        num_generation_tokens: Tokens generated.
        num_cached_tokens: Prompt tokens served from the prefix cache.
        finish_reason: ``"stop"``, ``"length"`` or ``"abort"``.
        stats: The completion's ``RequestStateStats`` when statistics are kept (the
            engine core's event times), else ``None``.
    """

    request_id: str
    parent_id: str
    arrival_time: float
    first_token_time: float | None
    last_token_time: float | None
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int
    finish_reason: str | None
    stats: RequestStateStats | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        """Arrival to last token."""
        return None if self.last_token_time is None else self.last_token_time - self.arrival_time


@dataclass
class FinishedRequestStats:
    """One finished request (vLLM's fields, those the API server measures).

    Attributes:
        finish_reason: ``FinishReason.STOP``, ``LENGTH`` or ``ABORT`` (vLLM's type; equal to
            the strings ``"stop"``, ``"length"``, ``"abort"``, and ``str()`` gives them).
        e2e_latency: Seconds from arrival to the last token.
        num_prompt_tokens: Prompt length.
        num_generation_tokens: Tokens generated.
        time_to_first_token: Seconds from arrival to the first token, if any came.
        num_cached_tokens: Prompt tokens served from the prefix cache.
        decode_time: Seconds from the first token to the last (with per-request
            statistics on the engine core's clock, as vLLM's; else on the API server's).
        queued_time: Seconds from being queued in the engine core to being first
            scheduled (vLLM's; 0 without per-request statistics).
        prefill_time: Seconds from being first scheduled to the first token (a
            preemption meanwhile included; 0 without per-request statistics or token).
        inference_time: Seconds from being first scheduled to the last token (0 without
            per-request statistics or token).
        request_id: The engine-core request id (a child id for ``n > 1``).
    """

    finish_reason: FinishReason
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    time_to_first_token: float | None
    num_cached_tokens: int = 0
    decode_time: float = 0.0
    queued_time: float = 0.0
    prefill_time: float = 0.0
    inference_time: float = 0.0
    request_id: str | None = None

    @property
    def mean_time_per_output_token(self) -> float:
        """Seconds per token after the first (vLLM's TPOT; 0 for one token)."""
        return self.decode_time / (self.num_generation_tokens - 1) if self.num_generation_tokens > 1 else 0.0


@dataclass
class IterationStats:
    """Request-side statistics of one batch of engine outputs.

    Attributes:
        num_prompt_tokens: Prompt tokens of requests that got their first token now.
        num_generation_tokens: Tokens generated in this batch.
        time_to_first_tokens: Seconds from arrival to first token, per new request.
        inter_token_latencies: Seconds since the request's previous tokens, one value per
            request that got tokens in this batch after earlier ones.
        finished_requests: Requests that finished in this batch.
    """

    timestamp: float = field(default_factory=time.monotonic)
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    #: vLLM's: requests preempted since the previous batch of outputs (IntervalViews fills it).
    num_preempted_reqs: int = 0
    #: vLLM's: when the batch was processed (``time.time()``).
    iteration_timestamp: float = field(default_factory=time.time)

    @property
    def time_to_first_tokens_iter(self) -> list[float]:
        """``time_to_first_tokens`` under vLLM's name (stat loggers ported from vLLM read it)."""
        return self.time_to_first_tokens

    @property
    def inter_token_latencies_iter(self) -> list[float]:
        """``inter_token_latencies`` under vLLM's name."""
        return self.inter_token_latencies


def iteration_stats(num_new_tokens: int, finished: list[RequestTiming],
                    first_tokens: list[RequestTiming] = (),
                    inter_token_latencies: list[float] = ()) -> IterationStats:
    """Build the statistics of one batch of outputs.

    Args:
        num_new_tokens: Tokens generated in the batch.
        finished: Timings of the completions that finished in it.
        first_tokens: Timings of the completions that got their first token in it: their
            prompt tokens and time to first token count in this batch, as vLLM counts them.
        inter_token_latencies: The batch's gaps since each request's previous tokens
            (``OutputProcessorOutput.inter_token_latencies``).
    """
    stats = IterationStats(num_generation_tokens=num_new_tokens, inter_token_latencies=list(inter_token_latencies))
    for t in first_tokens:
        stats.num_prompt_tokens += t.num_prompt_tokens
        if t.ttft is not None:
            stats.time_to_first_tokens.append(t.ttft)
    for t in finished:
        decode = (t.last_token_time - t.first_token_time
                  if t.first_token_time is not None and t.last_token_time is not None else 0.0)
        finished_stats = FinishedRequestStats(
            FinishReason(t.finish_reason or "abort"), t.e2e_latency or 0.0, t.num_prompt_tokens,
            t.num_generation_tokens, t.ttft, t.num_cached_tokens, decode, request_id=t.request_id)
        if t.stats is not None:
            _add_intervals(finished_stats, t.stats)
        stats.finished_requests.append(finished_stats)
    return stats


def _add_intervals(finished: FinishedRequestStats, s: RequestStateStats) -> None:
    """vLLM's per-request intervals, from the engine core's event times (one clock). A time
    never reached (0: the request was never scheduled, or made no token) gives 0, not the
    negative difference from it."""
    if s.queued_ts and s.scheduled_ts:
        finished.queued_time = s.scheduled_ts - s.queued_ts
    if s.scheduled_ts and s.first_token_ts:
        finished.prefill_time = s.first_token_ts - s.scheduled_ts
        finished.decode_time = s.last_token_ts - s.first_token_ts
        finished.inference_time = s.last_token_ts - s.scheduled_ts


class IntervalViews:
    """Fills vLLM's per-interval fields of the statistics stat loggers get.

    The engine core's ``SchedulerStats`` counters are cumulative (forkless's Prometheus
    counters take differences); vLLM's ``prefix_cache_stats`` and ``spec_decoding_stats``
    are what happened since the previous snapshot, and ``IterationStats.num_preempted_reqs``
    the preemptions since then. One instance per engine, fed every snapshot in order.
    """

    def __init__(self) -> None:
        self._last: SchedulerStats | None = None
        self._steps = 0

    def fill(self, scheduler: SchedulerStats | None, iteration: IterationStats | None) -> None:
        """Set the interval fields of this snapshot (in place)."""
        if scheduler is None:
            return
        last = self._last or SchedulerStats()
        self._steps += 1
        scheduler.step_counter = self._steps
        scheduler.prefix_cache_stats = PrefixCacheStats(
            queries=scheduler.prefix_cache_queries - last.prefix_cache_queries,
            hits=scheduler.prefix_cache_hits - last.prefix_cache_hits)
        if scheduler.spec_decode is not None:
            before = last.spec_decode or SpecDecodeStats()
            now = scheduler.spec_decode
            per_pos = list(now.num_accepted_tokens_per_pos)
            for j, n in enumerate(before.num_accepted_tokens_per_pos[:len(per_pos)]):
                per_pos[j] -= n
            scheduler.spec_decoding_stats = SpecDecodeStats(
                now.num_drafts - before.num_drafts, now.num_draft_tokens - before.num_draft_tokens,
                now.num_accepted_tokens - before.num_accepted_tokens, per_pos)
        if iteration is not None:
            iteration.num_preempted_reqs = scheduler.num_preemptions - last.num_preemptions
        self._last = scheduler
