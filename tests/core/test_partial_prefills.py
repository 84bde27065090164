"""A long prompt cannot stall everyone else: long-prefill chunks, concurrent partial prefills.

vLLM's flags, vLLM's meaning: a prefill with more than ``long_prefill_token_threshold``
tokens left is long and gets at most that many tokens per step; at most
``max_num_partial_prefills`` requests prefill in a step, at most
``max_long_partial_prefills`` of them long. ``core_fakes.check_step`` asserts the limits
after every step of every scheduler test (the stress test included).
"""

from __future__ import annotations

import pytest

from core_fakes import Result, assert_no_leaks, default_token, make_request, make_scheduler, run_all, step
from forkless.core.sched import SchedulerConfig


def plan(out) -> list[tuple[str, int, bool]]:
    return [(i.request_id, i.num_tokens, i.is_new) for i in out.scheduled_requests]


def test_long_prefill_is_chunked_and_a_later_short_request_joins_the_next_step() -> None:
    s, runner = make_scheduler(num_blocks=128, max_model_len=256, max_num_batched_tokens=64,
                               long_prefill_token_threshold=16)
    results: dict[str, Result] = {}
    s.add_request(make_request("long", 200, max_tokens=2))
    assert plan(step(s, runner, results)) == [("long", 16, True)]
    s.add_request(make_request("short", 3, max_tokens=4))
    # The very next step: the long prefill's next chunk, and the short request's prompt.
    assert plan(step(s, runner, results)) == [("long", 16, False), ("short", 3, True)]
    # The short request decodes next to the long prefill and finishes long before it.
    while "short" not in {rid for rid, r in results.items() if r.finish_reason is not None}:
        out = step(s, runner, results)
        assert ("long", 16, False) in plan(out)
    assert "long" not in results  # not even its first token yet
    run_all(s, runner, results)
    assert results["short"].token_ids == [default_token("short", i) for i in range(4)]
    assert results["long"].token_ids == [default_token("long", i) for i in range(2)]
    assert_no_leaks(s)


def test_without_a_threshold_the_long_prefill_takes_the_whole_budget() -> None:
    # vLLM's defaults (threshold 0): what the threshold is for.
    s, runner = make_scheduler(num_blocks=128, max_model_len=256, max_num_batched_tokens=64)
    results: dict[str, Result] = {}
    s.add_request(make_request("long", 200, max_tokens=1))
    step(s, runner, results)
    s.add_request(make_request("short", 3, max_tokens=1))
    assert plan(step(s, runner, results)) == [("long", 64, False)]
    assert plan(step(s, runner, results)) == [("long", 64, False)]
    assert plan(step(s, runner, results)) == [("long", 8, False), ("short", 3, True)]
    run_all(s, runner, results)
    assert_no_leaks(s)


def test_one_long_prefill_at_a_time_and_short_prompts_go_past_the_waiting_one() -> None:
    s, runner = make_scheduler(num_blocks=128, max_model_len=256, max_num_batched_tokens=64,
                               long_prefill_token_threshold=8)
    results: dict[str, Result] = {}
    s.add_request(make_request("a", 40, max_tokens=1, arrival=0))
    s.add_request(make_request("b", 40, max_tokens=1, arrival=1))
    s.add_request(make_request("c", 5, max_tokens=1, arrival=2))
    # b is long and a already is the one long prefill: c, queued behind b, goes first.
    assert plan(step(s, runner, results)) == [("a", 8, True), ("c", 5, True)]
    for _ in range(3):
        assert plan(step(s, runner, results)) == [("a", 8, False)]
    # a has 8 tokens left: no longer long, so b may start next to a's last chunk.
    assert plan(step(s, runner, results)) == [("a", 8, False), ("b", 8, True)]
    run_all(s, runner, results)
    assert set(results) == {"a", "b", "c"}
    assert_no_leaks(s)


def test_prompts_up_to_the_min_prompt_tokens_go_whole_and_side_by_side() -> None:
    # The same requests as above with long_prefill_min_prompt_tokens=40: a and b are
    # ordinary prompts now, admitted whole in one step; a longer one is still chunked.
    s, runner = make_scheduler(num_blocks=128, max_model_len=256, max_num_batched_tokens=128,
                               long_prefill_token_threshold=8, long_prefill_min_prompt_tokens=40)
    results: dict[str, Result] = {}
    s.add_request(make_request("a", 40, max_tokens=1, arrival=0))
    s.add_request(make_request("b", 40, max_tokens=1, arrival=1))
    s.add_request(make_request("long", 41, max_tokens=1, arrival=2))
    s.add_request(make_request("c", 5, max_tokens=1, arrival=3))
    assert plan(step(s, runner, results)) == [("a", 40, True), ("b", 40, True), ("long", 8, True), ("c", 5, True)]
    # A second long prompt still waits for the first (max_long_partial_prefills = 1).
    s.add_request(make_request("long2", 60, max_tokens=1, arrival=4))
    assert plan(step(s, runner, results)) == [("long", 8, False)]
    run_all(s, runner, results)
    assert set(results) == {"a", "b", "c", "long", "long2"}
    assert_no_leaks(s)


def test_max_long_partial_prefills_two() -> None:
    s, runner = make_scheduler(num_blocks=128, max_model_len=256, max_num_batched_tokens=64,
                               long_prefill_token_threshold=8, max_num_partial_prefills=3,
                               max_long_partial_prefills=2)
    for rid in ("a", "b", "c"):
        s.add_request(make_request(rid, 40, max_tokens=1))
    s.add_request(make_request("d", 4, max_tokens=1))
    assert plan(step(s, runner, {})) == [("a", 8, True), ("b", 8, True), ("d", 4, True)]
    run_all(s, runner)
    assert_no_leaks(s)


def test_max_num_partial_prefills_limits_prefills_not_decodes() -> None:
    s, runner = make_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=8,
                               max_num_partial_prefills=2)
    for i in range(5):
        s.add_request(make_request(f"r{i}", 6, max_tokens=3, arrival=i))
    results: dict[str, Result] = {}
    assert plan(step(s, runner, results)) == [("r0", 6, True), ("r1", 6, True)]
    assert plan(step(s, runner, results)) == [("r0", 1, False), ("r1", 1, False), ("r2", 6, True),
                                              ("r3", 6, True)]
    assert plan(step(s, runner, results)) == [("r0", 1, False), ("r1", 1, False), ("r2", 1, False),
                                              ("r3", 1, False), ("r4", 6, True)]
    run_all(s, runner, results)
    assert all(len(results[f"r{i}"].token_ids) == 3 for i in range(5))
    assert_no_leaks(s)


def test_a_budget_cut_prefill_still_counts_as_a_partial_prefill() -> None:
    s, runner = make_scheduler(max_num_batched_tokens=10, max_num_partial_prefills=1)
    s.add_request(make_request("a", 16, max_tokens=1))
    s.add_request(make_request("b", 4, max_tokens=1))
    assert plan(step(s, runner, {})) == [("a", 10, True)]
    assert plan(step(s, runner, {})) == [("a", 6, False)]  # b waits: a is still prefilling
    assert plan(step(s, runner, {})) == [("b", 4, True)]
    run_all(s, runner)
    assert_no_leaks(s)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_passed_over_long_prompts_keep_their_places(policy: str) -> None:
    s, runner = make_scheduler(num_blocks=128, max_model_len=128, max_num_batched_tokens=64,
                               long_prefill_token_threshold=8, policy=policy)
    s.add_request(make_request("first", 30, max_tokens=1, arrival=0))
    for rid in ("long1", "long2", "long3"):
        s.add_request(make_request(rid, 30, max_tokens=1, arrival=1))  # equal keys: insertion order
    s.add_request(make_request("short", 4, max_tokens=1, arrival=2))
    order: list[str] = []
    results: dict[str, Result] = {}
    while s.has_unfinished_requests():
        order += [i.request_id for i in step(s, runner, results).scheduled_requests if i.is_new]
    assert order == ["first", "short", "long1", "long2", "long3"]
    assert_no_leaks(s)


def test_a_long_prefill_preempted_by_a_higher_priority_decode() -> None:
    # A tight cache: the long prefill ahead of the decode in `running` is the victim.
    s, runner = make_scheduler(num_blocks=14, block_size=4, max_model_len=56, max_num_batched_tokens=32,
                               long_prefill_token_threshold=8, policy="priority")
    s.add_request(make_request("low", 50, max_tokens=4, arrival=0, priority=9))
    results: dict[str, Result] = {}
    step(s, runner, results)
    s.add_request(make_request("high", 5, max_tokens=50, arrival=1, priority=0))
    preempted_while_long = False
    while s.has_unfinished_requests():
        before = s.requests["low"].num_computed_tokens if "low" in s.requests else 0
        out = step(s, runner, results)
        preempted_while_long |= "low" in out.preempted_request_ids and 50 - before > 8
    assert preempted_while_long
    assert len(results["low"].token_ids) == 4 and len(results["high"].token_ids) == 50
    assert_no_leaks(s)


def test_limits_do_not_apply_without_chunked_prefill() -> None:
    s, runner = make_scheduler(max_model_len=32, max_num_batched_tokens=64, enable_chunked_prefill=False,
                               long_prefill_token_threshold=4)
    s.add_request(make_request("a", 20, max_tokens=1))
    s.add_request(make_request("b", 20, max_tokens=1))
    assert plan(step(s, runner, {})) == [("a", 20, True), ("b", 20, True)]
    run_all(s, runner)
    assert_no_leaks(s)


def test_config_defaults_and_vllm_rules() -> None:
    cfg = SchedulerConfig(max_model_len=8192)
    assert (cfg.long_prefill_token_threshold, cfg.max_num_partial_prefills, cfg.max_long_partial_prefills) == (
        0, None, 1)
    # vLLM: more than one partial prefill without a threshold -> 4 % of max_model_len.
    assert SchedulerConfig(max_model_len=8192, max_num_partial_prefills=4).long_prefill_token_threshold == 327
    assert SchedulerConfig(max_model_len=8192, max_num_partial_prefills=4,
                           long_prefill_token_threshold=64).long_prefill_token_threshold == 64
    assert SchedulerConfig(max_model_len=8192, max_num_partial_prefills=1).long_prefill_token_threshold == 0


@pytest.mark.parametrize("kwargs, match", [
    ({"max_num_partial_prefills": 0}, "max_num_partial_prefills"),
    ({"max_long_partial_prefills": 0}, "max_long_partial_prefills"),
    ({"max_num_partial_prefills": 2, "max_long_partial_prefills": 3}, "must be <="),
    ({"max_num_partial_prefills": 2, "enable_chunked_prefill": False, "max_num_batched_tokens": 64},
     "chunked prefill"),
    ({"max_num_partial_prefills": 2, "long_prefill_token_threshold": 65}, "greater than max_model_len"),
    ({"long_prefill_token_threshold": -1}, ">= 0"),
    ({"long_prefill_min_prompt_tokens": -1}, "long_prefill_min_prompt_tokens must be an integer >= 0"),
    ({"long_prefill_min_prompt_tokens": True}, "long_prefill_min_prompt_tokens must be an integer >= 0"),
])
def test_config_refuses_bad_combinations(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(max_model_len=64, **kwargs)
