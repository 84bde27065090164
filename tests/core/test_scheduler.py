"""The default Scheduler, driven step by step with a fake model runner."""

from __future__ import annotations

import msgspec
import pytest

from typing import TYPE_CHECKING

from core_fakes import (
    EOS,
    Params,
    Result,
    assert_no_leaks,
    default_token,
    make_request,
    make_scheduler,
    run_all,
    step,
)
from forkless.core.request import FinishReason, Request, RequestStatus

if TYPE_CHECKING:
    from forkless.core.sched import Scheduler, SchedulerOutput


def expected_tokens(rid: str, n: int) -> list[int]:
    return [default_token(rid, i) for i in range(n)]


def plan(out: SchedulerOutput) -> list[tuple[str, int, bool]]:
    return [(i.request_id, i.num_tokens, i.is_new) for i in out.scheduled_requests]


def test_new_requests_join_while_others_decode() -> None:
    s, runner = make_scheduler()
    results: dict[str, Result] = {}
    s.add_request(make_request("a", 10, max_tokens=6))
    assert plan(step(s, runner, results)) == [("a", 10, True)]
    assert plan(step(s, runner, results)) == [("a", 1, False)]
    s.add_request(make_request("b", 7, max_tokens=3))
    assert plan(step(s, runner, results)) == [("a", 1, False), ("b", 7, True)]
    assert plan(step(s, runner, results)) == [("a", 1, False), ("b", 1, False)]
    run_all(s, runner, results)
    assert results["a"].token_ids == expected_tokens("a", 6)
    assert results["b"].token_ids == expected_tokens("b", 3)
    assert results["a"].finish_reason is results["b"].finish_reason is FinishReason.LENGTH
    assert_no_leaks(s)


def test_max_num_seqs_and_token_budget_hold_every_step() -> None:
    s, runner = make_scheduler(max_num_seqs=2, max_num_batched_tokens=8)
    for i in range(5):
        s.add_request(make_request(f"r{i}", 6, max_tokens=4, arrival=i))
    results: dict[str, Result] = {}
    peak = 0
    while s.has_unfinished_requests():
        out = step(s, runner, results)  # asserts budget and max_num_seqs
        assert out.num_batched_tokens <= 8
        peak = max(peak, len(out.scheduled_requests))
    assert peak == 2
    for i in range(5):
        assert results[f"r{i}"].token_ids == expected_tokens(f"r{i}", 4)
    assert_no_leaks(s)


def test_chunked_prefill_splits_long_prompts() -> None:
    s, runner = make_scheduler(max_num_batched_tokens=16)
    s.add_request(make_request("p", 50, max_tokens=2))
    results: dict[str, Result] = {}
    chunks = []
    for _ in range(4):
        (item,) = step(s, runner, results).scheduled_requests
        chunks.append((item.start_position, item.num_tokens, item.sample, item.is_new))
    assert chunks == [(0, 16, False, True), (16, 16, False, False), (32, 16, False, False), (48, 2, True, False)]
    assert results["p"].token_ids == expected_tokens("p", 1)
    run_all(s, runner)
    assert_no_leaks(s)


def test_chunked_prefill_shares_steps_with_decodes() -> None:
    s, runner = make_scheduler(max_num_batched_tokens=8)
    s.add_request(make_request("d", 3, max_tokens=10))
    s.add_request(make_request("p", 20, max_tokens=2))
    results: dict[str, Result] = {}
    assert plan(step(s, runner, results)) == [("d", 3, True), ("p", 5, True)]
    assert plan(step(s, runner, results)) == [("d", 1, False), ("p", 7, False)]
    assert plan(step(s, runner, results)) == [("d", 1, False), ("p", 7, False)]
    assert plan(step(s, runner, results)) == [("d", 1, False), ("p", 1, False)]
    run_all(s, runner)
    assert_no_leaks(s)


def test_long_prefill_token_threshold_caps_chunks() -> None:
    s, runner = make_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=10)
    s.add_request(make_request("p", 25, max_tokens=1))
    results: dict[str, Result] = {}
    sizes = [plan(step(s, runner, results))[0][1] for _ in range(3)]
    assert sizes == [10, 10, 5]
    assert results["p"].finish_reason is FinishReason.LENGTH


def test_without_chunked_prefill_prompts_wait_for_a_whole_step() -> None:
    s, runner = make_scheduler(max_model_len=32, max_num_batched_tokens=32, enable_chunked_prefill=False)
    s.add_request(make_request("a", 20, max_tokens=2))
    s.add_request(make_request("b", 20, max_tokens=2))
    results: dict[str, Result] = {}
    assert plan(step(s, runner, results)) == [("a", 20, True)]
    assert plan(step(s, runner, results)) == [("a", 1, False), ("b", 20, True)]
    run_all(s, runner)
    assert_no_leaks(s)


def test_prefix_cache_hits_on_shared_prefixes() -> None:
    s, runner = make_scheduler(block_size=4)
    shared = list(range(100, 116))  # four full blocks
    s.add_request(make_request("a", shared + [1, 2, 3], max_tokens=2))
    results = run_all(s, runner)
    assert results["a"].num_cached_tokens == 0

    s.add_request(make_request("b", shared + [7, 8], max_tokens=2))
    out = step(s, runner, results)
    (item,) = out.scheduled_requests
    assert item.is_new and item.start_position == 16 and item.token_ids == [7, 8]
    assert item.prompt_token_ids == shared + [7, 8]
    stats = s.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (19 + 18, 16)
    run_all(s, runner)
    assert s.requests == {}
    # An identical prompt still recomputes its last token (a partial block of 1 here).
    s.add_request(make_request("c", shared, max_tokens=1))
    results = run_all(s, runner)
    assert results["c"].num_cached_tokens == 12
    assert results["c"].token_ids == expected_tokens("c", 1)
    assert_no_leaks(s)


def test_prefix_hit_reported_in_engine_outputs() -> None:
    s, runner = make_scheduler(block_size=4)
    s.add_request(make_request("a", list(range(9)), max_tokens=1))
    run_all(s, runner)
    s.add_request(make_request("b", list(range(9)), max_tokens=3))
    results = run_all(s, runner)
    assert results["b"].num_cached_tokens == 8
    assert results["b"].token_ids == expected_tokens("b", 3)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_under_a_tiny_kv_cache(prefix_caching: bool) -> None:
    def workload(num_blocks: int) -> tuple[dict[str, Result], list[str], Scheduler]:
        s, runner = make_scheduler(num_blocks=num_blocks, max_model_len=32, prefix_caching=prefix_caching)
        for i in range(4):
            s.add_request(make_request(f"r{i}", 6 + i, max_tokens=12, arrival=i))
        return run_all(s, runner), runner.registrations, s

    roomy, _, _ = workload(num_blocks=64)
    tight, registrations, s = workload(num_blocks=8)
    assert s.make_stats().num_preemptions > 0
    # Preempted requests were re-registered with the outputs they already had.
    assert len(registrations) > 4
    for i in range(4):
        rid = f"r{i}"
        assert tight[rid].token_ids == roomy[rid].token_ids == expected_tokens(rid, 12)
        assert tight[rid].finish_reason is FinishReason.LENGTH
    assert_no_leaks(s)


def test_preempted_request_restarts_with_its_outputs() -> None:
    s, runner = make_scheduler(num_blocks=8, block_size=4, max_model_len=32, prefix_caching=False)
    s.add_request(make_request("old", 12, max_tokens=20, arrival=0))
    s.add_request(make_request("new", 12, max_tokens=20, arrival=1))
    results: dict[str, Result] = {}
    preempted_at = None
    while preempted_at is None:
        out = step(s, runner, results)
        if out.preempted_request_ids:
            preempted_at = out
    assert preempted_at.preempted_request_ids == ["new"]  # fcfs: latest arrival yields
    victim = s.requests["new"]
    assert victim.status is RequestStatus.PREEMPTED and victim.block_ids == []
    assert victim.num_computed_tokens == 0 and victim.num_output_tokens > 0
    while True:
        out = step(s, runner, results)
        readmitted = [i for i in out.scheduled_requests if i.request_id == "new"]
        if readmitted:
            break
    (item,) = readmitted
    assert item.is_new and item.start_position == 0
    assert item.output_token_ids == expected_tokens("new", len(item.output_token_ids))
    assert item.token_ids == item.prompt_token_ids + item.output_token_ids
    run_all(s, runner, results)
    assert results["new"].token_ids == expected_tokens("new", 20)
    assert_no_leaks(s)


@pytest.mark.parametrize("policy, victim", [("priority", "low"), ("fcfs", "high")])
def test_preemption_victim_follows_the_policy(policy: str, victim: str) -> None:
    s, runner = make_scheduler(num_blocks=8, block_size=4, max_model_len=32, policy=policy)
    requests = {
        "low": make_request("low", 12, max_tokens=16, arrival=0, priority=9),
        "high": make_request("high", 12, max_tokens=16, arrival=1, priority=0),
    }
    for request in requests.values():
        s.add_request(request)
    results = run_all(s, runner)
    assert {rid for rid, r in requests.items() if r.num_preemptions} == {victim}
    for rid in requests:
        assert results[rid].token_ids == expected_tokens(rid, 16)
    assert_no_leaks(s)


def admission_order(policy: str, requests: list[tuple[str, int, float]]) -> list[str]:
    s, runner = make_scheduler(policy=policy, max_num_seqs=1)
    for rid, priority, arrival in requests:
        s.add_request(make_request(rid, 4, max_tokens=1, arrival=arrival, priority=priority))
    order: list[str] = []
    results: dict[str, Result] = {}
    while s.has_unfinished_requests():
        order += [i.request_id for i in step(s, runner, results).scheduled_requests if i.is_new]
    return order


def test_priority_policy_orders_by_priority_then_arrival() -> None:
    reqs = [("late-low", 5, 0.0), ("hi-late", 1, 2.0), ("hi-early", 1, 1.0), ("mid", 3, 0.5)]
    assert admission_order("priority", reqs) == ["hi-early", "hi-late", "mid", "late-low"]


def test_fcfs_ignores_priority() -> None:
    reqs = [("a", 5, 0.0), ("b", 1, 1.0), ("c", 3, 2.0)]
    assert admission_order("fcfs", reqs) == ["a", "b", "c"]


def test_equal_keys_keep_insertion_order() -> None:
    reqs = [("x", 1, 1.0), ("y", 1, 1.0), ("z", 1, 1.0)]
    assert admission_order("priority", reqs) == ["x", "y", "z"]


def test_abort_frees_blocks_and_tells_the_runner() -> None:
    s, runner = make_scheduler(max_num_seqs=1)
    s.add_request(make_request("run", 10, max_tokens=50))
    s.add_request(make_request("wait", 10, max_tokens=50))
    results: dict[str, Result] = {}
    step(s, runner, results)
    assert s.kv_cache_manager.usage > 0 and "run" in runner.tokens
    s.finish_requests(["run", "wait", "unknown"], FinishReason.ABORT)
    assert not s.has_unfinished_requests() and s.get_num_unfinished_requests() == 0
    assert_no_leaks(s)
    out = step(s, runner, results)
    assert sorted(out.finished_request_ids) == ["run", "wait"] and out.is_empty
    assert runner.tokens == {}
    assert results["run"].finish_reason is None  # aborts are not echoed as outputs


def test_abort_while_the_step_runs() -> None:
    s, runner = make_scheduler()
    s.add_request(make_request("a", 10, max_tokens=5))
    s.add_request(make_request("b", 10, max_tokens=5))
    out = s.schedule()
    runner_out = runner.execute(out)
    s.finish_requests("a", FinishReason.ABORT)
    outputs = s.update_from_output(out, runner_out)
    assert [o.request_id for o in outputs] == ["b"]
    s.kv_cache_manager.check_invariants()
    run_all(s, runner)
    assert_no_leaks(s)


def test_kept_tokens_are_those_the_update_appends() -> None:
    """What the grammars may take before the update (Scheduler.kept_tokens) is exactly
    what update_from_output then appends: not the token of a request aborted while the
    step ran, nor of a row that did not sample, nor of a request not asked for."""
    s, runner = make_scheduler()
    for rid in "abc":
        s.add_request(make_request(rid, 10, max_tokens=5))
    out = s.schedule()
    runner_out = runner.execute(out)
    s.finish_requests("a", FinishReason.ABORT)
    kept = s.kept_tokens(out, runner_out, {"a", "b"})
    outputs = s.update_from_output(out, runner_out)
    assert kept == [(o.request_id, o.new_token_ids) for o in outputs if o.request_id == "b"]
    assert kept and kept[0][1] == runner_out.sampled_token_ids["b"]
    # Several tokens in a row (verified drafts, which a stop may cut): not taken early.
    runner_out.sampled_token_ids["b"] = [1, 2]
    assert s.kept_tokens(out, runner_out, {"b"}) is None


def test_abort_a_preempted_request() -> None:
    s, runner = make_scheduler(num_blocks=8, block_size=4, max_model_len=32)
    s.add_request(make_request("a", 12, max_tokens=16, arrival=0))
    s.add_request(make_request("b", 12, max_tokens=16, arrival=1))
    results: dict[str, Result] = {}
    while not s.num_preemptions:
        step(s, runner, results)
    assert s.requests["b"].status is RequestStatus.PREEMPTED
    s.finish_requests("b", FinishReason.ABORT)
    run_all(s, runner, results)
    assert results["a"].token_ids == expected_tokens("a", 16)
    assert_no_leaks(s)


def eos_from(index: int):
    def token_fn(rid: str, i: int) -> int:
        return EOS if i >= index else default_token(rid, i)

    return token_fn


def run_one(token_fn=default_token, prompt: int = 5, max_model_len: int = 64, **params) -> Result:
    s, runner = make_scheduler(max_model_len=max_model_len, token_fn=token_fn)
    s.add_request(make_request("r", prompt, **params))
    result = run_all(s, runner)["r"]
    assert_no_leaks(s)
    return result


def test_stop_on_eos() -> None:
    result = run_one(eos_from(2), max_tokens=10)
    assert result.token_ids == expected_tokens("r", 2) + [EOS]
    assert result.finish_reason is FinishReason.STOP and result.stop_reason is None


def test_ignore_eos_runs_to_max_tokens() -> None:
    result = run_one(eos_from(2), max_tokens=6, ignore_eos=True)
    assert len(result.token_ids) == 6 and result.finish_reason is FinishReason.LENGTH


def test_min_tokens_defers_eos() -> None:
    result = run_one(eos_from(1), max_tokens=10, min_tokens=4)
    assert len(result.token_ids) == 4 and result.finish_reason is FinishReason.STOP


def test_stop_token_ids() -> None:
    stop = default_token("r", 3)
    result = run_one(max_tokens=10, stop_token_ids=[stop])
    assert result.token_ids == expected_tokens("r", 4)
    assert result.finish_reason is FinishReason.STOP and result.stop_reason == stop


def test_max_model_len_caps_generation() -> None:
    result = run_one(prompt=10, max_model_len=16, max_tokens=None)
    assert len(result.token_ids) == 6 and result.finish_reason is FinishReason.LENGTH


def test_no_max_tokens_and_no_eos_generates_to_max_model_len() -> None:
    s, runner = make_scheduler(max_model_len=12)
    s.add_request(Request("bare", [1, 2, 3], Params(max_tokens=None), eos_token_id=None))
    assert len(run_all(s, runner)["bare"].token_ids) == 9


def test_stats_and_reset_prefix_cache() -> None:
    s, runner = make_scheduler(max_num_seqs=1, block_size=4)
    s.add_request(make_request("a", list(range(9)), max_tokens=3))
    s.add_request(make_request("b", list(range(9)), max_tokens=3))
    step(s, runner, {})
    stats = s.make_stats()
    assert (stats.num_running, stats.num_waiting) == (1, 1)
    assert 0 < stats.kv_cache_usage <= 1
    run_all(s, runner)
    assert s.make_stats().prefix_cache_hits == 8
    assert s.reset_prefix_cache()
    s.add_request(make_request("c", list(range(9)), max_tokens=1))
    assert run_all(s, runner)["c"].num_cached_tokens == 0
    assert_no_leaks(s)


def test_outputs_are_plain_data() -> None:
    s, runner = make_scheduler()
    s.add_request(make_request("a", 5, max_tokens=1))
    out = s.schedule()
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(out))
    # A scheduled request is an array too (hundreds a step, decoded by every worker).
    item = decoded["scheduled_requests"][0]
    assert item[:2] == ["a", out.scheduled_requests[0].token_ids]
    assert item[6]["max_tokens"] == 1  # its sampling parameters
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(out), type=type(out)) == out
    (eco,) = s.update_from_output(out, runner.execute(out))
    # An array on the wire (no field names: one per request per step), plain data still.
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(eco))
    assert raw[:3] == ["a", eco.new_token_ids, "length"]
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(eco), type=type(eco)) == eco
