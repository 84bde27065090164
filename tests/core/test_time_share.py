"""Long prefills take a bounded share of the time while others run (``long_prefill_time_share``).

The scheduler measures step times with a clock; here the clock is simulated and each step
costs what a cost model says, shaped like a small model on a CPU: a plain step costs
10 ms, and a long prompt's chunk token costs more the later it sits in the prompt (it
attends over everything before it), until one token costs twice a whole plain step.
"""

from __future__ import annotations

from core_fakes import FakeRunner, Result, assert_no_leaks, make_request, make_scheduler, run_all, step
from forkless.core.sched import Scheduler
from forkless.core.sched.time_share import LongPrefillTimeShare

PLAIN_S = 0.010
DECODE_S = 0.002  # each decoding request in a step


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CostedRunner:
    """A FakeRunner whose every step advances the clock by the step's modelled cost."""

    def __init__(self, scheduler: Scheduler, runner: FakeRunner, clock: Clock, aftermath: float = 0.0) -> None:
        self.scheduler, self.runner, self.clock = scheduler, runner, clock
        self.tokens = runner.tokens
        self.block_tables = runner.block_tables
        # The step after a long chunk costs this much more (its caches were flushed).
        self.aftermath = aftermath
        self._after_chunk = False

    def execute(self, out):  # noqa: ANN001, ANN201 - FakeRunner's signature
        cost = PLAIN_S * (1 + self.aftermath) if self._after_chunk else PLAIN_S
        self._after_chunk = False
        for item in out.scheduled_requests:
            if item.start_position < self.scheduler.requests[item.request_id].num_prompt_tokens:
                # A prompt chunk: dearer the later its tokens.
                cost += item.num_tokens * PLAIN_S * (0.05 + item.start_position / 1000)
                self._after_chunk = self._after_chunk or item.num_tokens > 8
            else:
                cost += DECODE_S
        self.clock.now += cost
        return self.runner.execute(out)


def setup(share: float, aftermath: float = 0.0, **kw: object):  # noqa: ANN201
    clock = Clock()
    s, runner = make_scheduler(num_blocks=4096, max_model_len=4096, max_num_batched_tokens=256,
                               long_prefill_token_threshold=64, long_prefill_time_share=share, **kw)
    if share:
        s._time_share = LongPrefillTimeShare(share, 64, clock=clock)
    return s, CostedRunner(s, runner, clock, aftermath), clock


def short_latencies(share: float, n: int = 12, burst: int = 0,
                    aftermath: float = 0.0) -> tuple[list[float], float, int]:
    """Latencies of ``n`` short requests sent one after another, with a long prompt
    prefilling from position 1,000 on; also one alone, and the long prompt's progress.
    ``burst`` requests decode next to the long prompt first, and are gone when the short
    ones come."""
    s, runner, clock = setup(share, aftermath)
    results: dict[str, Result] = {}

    def run_short(rid: str) -> float:
        s.add_request(make_request(rid, 8, max_tokens=16, ignore_eos=True))
        start = clock.now
        while rid not in results or results[rid].finish_reason is None:
            step(s, runner, results)
        return clock.now - start

    alone = run_short("alone")
    s.add_request(make_request("long", 4000, max_tokens=1))
    for i in range(burst):
        s.add_request(make_request(f"burst{i}", 4, max_tokens=30, ignore_eos=True))
    while s.requests["long"].num_computed_tokens < 1000 or any(f"burst{i}" in s.requests for i in range(burst)):
        step(s, runner, results)
    done_before = s.requests["long"].num_computed_tokens
    latencies = [run_short(f"short{i}") for i in range(n)]
    assert "long" not in results, "the long prompt finished: the shorts did not all meet it"
    progress = s.requests["long"].num_computed_tokens - done_before
    run_all(s, runner, results)
    assert results["long"].finish_reason is not None
    assert_no_leaks(s)
    return [x / alone for x in latencies], alone, progress


def test_others_take_at_most_about_twice_as_long_while_a_long_prompt_prefills() -> None:
    ratios, _, progress = short_latencies(0.5)
    # 1 / (1 - share) = 2, plus at most one chunk's overshoot.
    assert max(ratios) <= 2.3, ratios
    assert progress > 0  # the long prompt is not starved either


def test_a_heavy_batch_that_has_gone_does_not_set_the_pace() -> None:
    # 60 requests decoding made steps 13x dearer; measured against those, every chunk of the
    # long prompt looked free. What the others pay is measured against the batch of now.
    ratios, _, _ = short_latencies(0.5, burst=60)
    assert max(ratios) <= 2.3, ratios


def test_a_plain_step_made_dearer_by_the_chunk_before_it_is_not_the_batch_s_cost() -> None:
    # A step right after a long chunk runs slower (on a CPU the chunk read its whole
    # context's KV, flushing the caches): here half as slow again. Averaged into the plain
    # step's cost it made every chunk look cheaper than it was, and the others took 2.54x
    # as long at a 0.5 share (bound 2, plus one chunk); against the least recent plain step
    # 2.2x.
    ratios, _, progress = short_latencies(0.5, aftermath=0.5)
    assert max(ratios) <= 2.3, ratios
    assert progress > 0


def test_without_the_time_share_the_token_cap_alone_lets_them_slow_down_far_more() -> None:
    # What the time share is for: the same load with only the 64-token cap.
    ratios, _, _ = short_latencies(0.0, n=2)
    assert min(ratios) > 4, ratios


def test_a_smaller_share_leaves_the_others_more() -> None:
    ratios, _, _ = short_latencies(0.2)
    assert max(ratios) <= 1.4, ratios  # 1 / (1 - 0.2) = 1.25, plus one chunk


def test_a_long_prompt_alone_is_not_limited() -> None:
    s, runner, _ = setup(0.5)
    results: dict[str, Result] = {}
    s.add_request(make_request("long", 1000, max_tokens=1))
    for _ in range(10):
        out = step(s, runner, results)
        assert [(i.request_id, i.num_tokens) for i in out.scheduled_requests] == [("long", 64)]


def test_a_long_prompt_runs_when_nothing_else_can() -> None:
    # The short request waits for a sequence slot the long prompt holds: the long prompt
    # must not be held back for it (the step would be empty, and nothing would move).
    s, runner, _ = setup(0.5, max_num_seqs=1)
    results: dict[str, Result] = {}
    s.add_request(make_request("long", 1000, max_tokens=1))
    step(s, runner, results)
    s.add_request(make_request("short", 8, max_tokens=4))
    for _ in range(5):
        out = step(s, runner, results)
        assert [(i.request_id, i.num_tokens) for i in out.scheduled_requests] == [("long", 64)]
    run_all(s, runner, results)
    assert results["short"].finish_reason is not None
    assert_no_leaks(s)


def test_chunks_shrink_late_in_the_prompt_and_stay_within_the_cap() -> None:
    s, runner, _ = setup(0.5)
    results: dict[str, Result] = {}
    s.add_request(make_request("long", 1500, max_tokens=1))
    s.add_request(make_request("decoding", 8, max_tokens=4000, ignore_eos=True))
    chunks: list[tuple[int, int]] = []
    while "long" not in results:
        out = step(s, runner, results)
        ids = [i.request_id for i in out.scheduled_requests]
        if "decoding" in ids:  # contended steps only
            chunks += [(i.start_position, i.num_tokens) for i in out.scheduled_requests if i.request_id == "long"]
    assert all(1 <= n <= 64 for _, n in chunks)
    early = [n for pos, n in chunks if pos < 200]
    late = [n for pos, n in chunks if pos > 1200]
    assert late and max(late) < max(early) / 4, (early, late)

