"""Several batches in flight (pipeline parallelism's micro-batches), driven with the fake
runner: a plan is made while the one before has not reported back, so no plan may feed a
token that is still in flight, and the requests split into groups that take turns."""

from __future__ import annotations

from collections import deque

import pytest

from core_fakes import Result, assert_no_leaks, check_step, default_token, make_request, make_scheduler
from forkless.core.sched import Scheduler, SchedulerOutput


def _run_two_in_flight(s: Scheduler, runner, max_steps: int = 2_000) -> tuple[dict[str, Result], list[int]]:
    """Keep up to two plans in flight: plan, run, plan the next, then apply the oldest."""
    results: dict[str, Result] = {}
    in_flight: deque[tuple[SchedulerOutput, object]] = deque()
    sizes: list[int] = []
    for _ in range(max_steps):
        if not s.has_unfinished_requests() and not in_flight:
            return results, sizes
        if len(in_flight) < 2 and s.has_unfinished_requests():
            out = s.schedule()
            check_step(s, out)
            flying = {i.request_id for plan, _ in in_flight for i in plan.scheduled_requests if i.sample}
            assert not flying & {i.request_id for i in out.scheduled_requests}, "a token still in flight was fed"
            sizes.append(len(out.scheduled_requests))
            in_flight.append((out, runner.execute(out)))  # the fake runner checks every fed token
            if out.scheduled_requests and len(in_flight) < 2:
                continue
        plan, runner_out = in_flight.popleft()
        for eco in s.update_from_output(plan, runner_out):
            result = results.setdefault(eco.request_id, Result())
            result.token_ids.extend(eco.new_token_ids)
            result.finish_reason = eco.finish_reason
    raise AssertionError(f"not finished after {max_steps} steps")


@pytest.mark.parametrize("num_blocks", [64, 12])  # 12: preemptions while batches are in flight
def test_two_batches_in_flight_give_every_request_its_tokens(num_blocks: int) -> None:
    s, runner = make_scheduler(num_blocks=num_blocks, max_model_len=48, max_num_batched_tokens=16,
                               enable_chunked_prefill=True)
    s.set_max_concurrent_batches(2)
    lengths = {"a": 5, "b": 9, "c": 30, "d": 3, "e": 12, "f": 7}
    for i, (rid, n) in enumerate(lengths.items()):
        s.add_request(make_request(rid, n, max_tokens=6 + i, arrival=float(i)))
    results, sizes = _run_two_in_flight(s, runner)
    for i, rid in enumerate(lengths):
        assert results[rid].token_ids == [default_token(rid, k) for k in range(6 + i)]
    # Six requests in two batches: at most three in each.
    assert max(sizes) == 3
    assert (s.num_preemptions > 0) == (num_blocks == 12)
    assert_no_leaks(s)


def test_the_groups_take_turns_in_decode() -> None:
    s, runner = make_scheduler(max_num_batched_tokens=64)
    s.set_max_concurrent_batches(2)
    for rid in "abcd":
        s.add_request(make_request(rid, 4, max_tokens=8))
    first = s.schedule()
    runner_first = runner.execute(first)
    second = s.schedule()
    runner.execute(second)
    one = [i.request_id for i in first.scheduled_requests]
    two = [i.request_id for i in second.scheduled_requests]
    # Half of the requests each, disjoint: the second batch runs while the first is in flight.
    assert len(one) == len(two) == 2 and not set(one) & set(two)
    s.update_from_output(first, runner_first)
    third = s.schedule()
    assert [i.request_id for i in third.scheduled_requests] == one
