"""Long prefills get a bounded share of the time while other requests run.

A token cap per step (``long_prefill_token_threshold``) does not bound what a long prompt
costs the others: late in an 8k-token prompt one chunk token attends over the whole
context, and on a CPU even a one-token chunk there costs more than a whole decode step of
a small model. What the other clients feel is time, so this bounds time, measured:

* A step is *contended* when some request other than the long prefills is running or
  waiting. Uncontended steps are not limited (a long prompt alone runs at full speed).
* Contended steps without a long chunk (*plain*) set ``plain``, the least duration of
  the last few (``_PLAIN_WINDOW``). A contended step with long chunks (*laden*) costs the
  others its duration minus ``plain``: the *extra*. ``plain`` must describe the batch of
  now, not of a burst long gone (a stale, too high one reads every chunk as free): it is
  forgotten when contention ends, and every ``_REMEASURE_EVERY`` laden steps one step runs
  plain.
* Long prefills hold a time credit. Every contended step earns them ``share / (1 -
  share)`` of its plain time; every laden step spends its extra. A long chunk is scheduled
  only while the credit is not negative, so over any stretch of contended steps the long
  prefills take at most ``share`` of the time, plus one chunk: the others' requests take
  at most ``1 / (1 - share)`` times as long as they would alone (2x at 0.5).
* The chunk is sized so that one laden step's extra is about what a contended step earns
  (``share / (1 - share) * plain``): small chunks late in a long context, up to the token
  cap early, so that the long prefill's turns are short and frequent rather than long and
  rare (a short request then meets several small chunks, never one huge one).

Times are the scheduler's own wall-clock view of a step: from the end of ``schedule()``
(or the previous step's result, whichever is later, so that overlapping steps under async
scheduling are not counted twice) to ``update_from_output()``. No part of the engine
reports timings, so this works with any executor, worker or platform.

Invariants: the credit never exceeds one step's earnings (no long burst after a quiet
period); the chunk is between 1 and the token cap; nothing here changes which tokens are
computed, only in which step. A long prefill is held back only in a step that runs other
work instead: when nothing else can run, it runs (``Scheduler.schedule``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

# Plain steps ``plain`` is the least of. The least, not a mean: a step right after a long
# chunk is slower (on a CPU the chunk read its whole context's KV and flushed the caches),
# and a mean of such steps made every chunk look cheaper than it was: with an 8k-token
# prompt against 16-token requests at one a second, 44 % of the contended time went to the
# long prompt at a 0.4 share, 40 % with the least of 8 (benchmarks/README.md, "Hostile
# clients"). A batch that shrinks is seen at once; one that grows after at most this many
# plain steps, and until then the long prefill gets less than its share, not more.
_PLAIN_WINDOW = 8
# Laden steps in a row before one runs plain to measure it again (the long prefill then
# loses at most one turn in this many).
_REMEASURE_EVERY = 8


class LongPrefillTimeShare:
    """The time-share bookkeeping of one scheduler.

    Args:
        share: Most of the contended time long prefills may take, in (0, 1).
        max_chunk: The token cap of a long prefill's chunk
            (``long_prefill_token_threshold``).
        clock: Seconds, monotonic (tests pass a simulated one).
    """

    def __init__(self, share: float, max_chunk: int, clock: Callable[[], float] = time.perf_counter) -> None:
        if not 0.0 < share < 1.0:
            raise ValueError(f"long_prefill_time_share must be in (0, 1), got {share!r}")
        self.ratio = share / (1.0 - share)
        self.max_chunk = max_chunk
        self.credit = 0.0
        self.plain: float | None = None
        self._laden_in_a_row = 0
        self._plain_recent: deque[float] = deque(maxlen=_PLAIN_WINDOW)
        # Seconds one long-chunk token adds to a step (moving average).
        self.token_cost: float | None = None
        # Steps scheduled and not yet back: (output, contended, long tokens, start time).
        self._in_flight: deque[tuple[Any, bool, int, float]] = deque()
        self._clock = clock
        self._last_done = clock()

    def long_chunk(self, contended: bool) -> int:
        """Tokens a long prefill may compute this step: 0 to skip it.

        Args:
            contended: Whether other requests are running or waiting.
        """
        if not contended:
            return self.max_chunk
        if self.plain is None or self.credit < 0.0 or self._laden_in_a_row >= _REMEASURE_EVERY:
            # Without a (recent) plain measurement the extra could not be told apart: run
            # one step without the long chunk first.
            return 0
        if self.token_cost is None:
            return 1
        if self.token_cost <= 0.0:
            return self.max_chunk  # too cheap to measure
        # The chunk whose extra is what one step earns.
        return int(min(max(self.ratio * self.plain / self.token_cost, 1), self.max_chunk))

    def scheduled(self, output: Any, contended: bool, long_tokens: int) -> None:
        """Record a step at the end of ``schedule()``.

        Args:
            output: The step's ``SchedulerOutput`` (matched by identity later).
            contended: Whether the step was contended.
            long_tokens: The largest long chunk in it (0: none).
        """
        self._in_flight.append((output, contended, long_tokens, self._clock()))

    def done(self, output: Any) -> None:
        """Account a step at ``update_from_output()``."""
        while self._in_flight:
            item, contended, long_tokens, started = self._in_flight.popleft()
            if item is output:
                break
        else:
            return  # not one of ours (already accounted, or scheduled before a reset)
        now = self._clock()
        elapsed = now - max(started, self._last_done)
        self._last_done = now
        if not contended:
            self.credit = 0.0  # nobody was waiting: the long prefill owes no one
            self.plain = None  # the next contended batch may be nothing like the last
            self._plain_recent.clear()
            if long_tokens:  # the whole step was the chunk: an upper bound of its cost
                self._add_token_cost(elapsed / long_tokens)
            return
        if not long_tokens:
            self._laden_in_a_row = 0
            self._plain_recent.append(elapsed)
            self.plain = min(self._plain_recent)
            self.credit = min(self.credit + self.ratio * elapsed, self.ratio * self.plain)
            return
        plain = self.plain if self.plain is not None else 0.0
        extra = max(elapsed - plain, 0.0)
        self._add_token_cost(extra / long_tokens)
        self._laden_in_a_row += 1
        self.credit = min(self.credit + self.ratio * plain - extra, self.ratio * plain)

    def _add_token_cost(self, cost: float) -> None:
        # A token's cost grows with its position: weigh the newest measurement heavily.
        self.token_cost = cost if self.token_cost is None else 0.5 * (self.token_cost + cost)
