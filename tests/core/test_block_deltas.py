"""Block ids cross to the runner as deltas: the whole table at (re)admission, then only
the ids appended since the request was last scheduled (``new_block_ids``).

Every test driven through ``core_fakes.step`` also checks that the runner's tables, rebuilt
from the deltas, equal the scheduler's; these tests pin down the deltas themselves.
"""

from __future__ import annotations

import msgspec

from core_fakes import (
    BlockTableMirror,
    Result,
    assert_no_leaks,
    default_token,
    make_request,
    make_scheduler,
    run_all,
    step,
)
from forkless.core.sched import ModelRunnerOutput, SchedulerOutput
from forkless.protocol.step import PLACEHOLDER_TOKEN_ID


def items(out: SchedulerOutput, rid: str) -> list:
    return [i for i in out.scheduled_requests if i.request_id == rid]


def test_admission_sends_the_whole_table_then_only_appended_blocks() -> None:
    s, runner = make_scheduler(block_size=4)
    s.add_request(make_request("a", 6, max_tokens=10))
    results: dict[str, Result] = {}
    (first,) = items(step(s, runner, results), "a")
    assert first.is_new and first.new_block_ids == s.requests["a"].block_ids and len(first.new_block_ids) == 2
    sent = list(first.new_block_ids)
    # Decodes at positions 6, 7 fit block 2; positions 8 and 12 each need one more block.
    for position in range(6, 13):
        (item,) = items(step(s, runner, results), "a")
        assert not item.is_new and item.start_position == position
        if position % 4 == 0:
            assert len(item.new_block_ids) == 1
        else:
            assert item.new_block_ids == []
        sent += item.new_block_ids
        assert sent == s.requests["a"].block_ids
    run_all(s, runner, results)
    assert results["a"].token_ids == [default_token("a", i) for i in range(10)]
    assert_no_leaks(s)


def test_chunked_prefill_sends_each_chunks_new_blocks() -> None:
    s, runner = make_scheduler(block_size=4, max_num_batched_tokens=5, enable_chunked_prefill=True)
    s.add_request(make_request("a", 14, max_tokens=2))
    results: dict[str, Result] = {}
    chunks = []
    while "a" in s.requests:
        out = step(s, runner, results)
        chunks += [(i.start_position, i.num_tokens, list(i.new_block_ids)) for i in items(out, "a")]
    sent = [b for _, _, ids in chunks for b in ids]
    assert len(sent) == len(set(sent)) == 4  # 15 computed tokens, each block sent once
    assert [len(ids) for _, _, ids in chunks] == [2, 1, 1, 0]  # tokens 0-4, 5-9, 10-13, 14
    assert_no_leaks(s)


def test_prefix_hits_at_admission_lead_the_whole_table() -> None:
    s, runner = make_scheduler(block_size=4)
    prompt = list(range(100, 113))  # three full blocks and one token
    results: dict[str, Result] = {}
    s.add_request(make_request("a", prompt, max_tokens=4))
    step(s, runner, results)
    hits = s.requests["a"].block_ids[:3]
    s.add_request(make_request("b", prompt, max_tokens=4))
    (item,) = items(step(s, runner, results), "b")
    assert item.is_new and item.start_position == 12
    assert item.new_block_ids == s.requests["b"].block_ids and item.new_block_ids[:3] == hits
    (item,) = items(step(s, runner, results), "b")
    assert item.new_block_ids == []  # position 13 fits its fourth block
    run_all(s, runner, results)
    assert results["b"].num_cached_tokens == 12
    assert_no_leaks(s)


def test_readmission_after_preemption_sends_a_fresh_whole_table() -> None:
    s, runner = make_scheduler(num_blocks=8, block_size=4, max_model_len=32, prefix_caching=False)
    s.add_request(make_request("old", 12, max_tokens=20, arrival=0))
    s.add_request(make_request("new", 12, max_tokens=20, arrival=1))
    results: dict[str, Result] = {}
    while not step(s, runner, results).preempted_request_ids:
        pass
    victim = s.requests["new"]
    assert victim.block_ids == [] and victim.num_block_ids_sent == 0
    assert "new" not in runner.block_tables.tables
    while not (readmitted := items(step(s, runner, results), "new")):
        pass
    (item,) = readmitted
    assert item.is_new and item.new_block_ids == s.requests["new"].block_ids
    assert s.requests["new"].num_block_ids_sent == len(item.new_block_ids)
    run_all(s, runner, results)
    assert results["new"].token_ids == [default_token("new", i) for i in range(20)]
    assert_no_leaks(s)


def test_abort_then_reuse_of_the_id_starts_a_new_table() -> None:
    s, runner = make_scheduler(block_size=4)
    s.add_request(make_request("a", 9, max_tokens=8))
    results: dict[str, Result] = {}
    step(s, runner, results)
    step(s, runner, results)
    s.finish_requests("a")
    s.add_request(make_request("a", 5, max_tokens=2))
    out = step(s, runner, results)
    assert out.finished_request_ids == ["a"]
    (item,) = items(out, "a")
    assert item.is_new and item.new_block_ids == s.requests["a"].block_ids
    run_all(s, runner, results)
    assert_no_leaks(s)


def test_async_scheduling_with_placeholders_keeps_the_tables_in_step() -> None:
    """Step N+1 is scheduled before step N's tokens are back (placeholders): the deltas
    still add up, including the block that a placeholder's position needs."""
    s, _ = make_scheduler(num_blocks=16, block_size=4, max_model_len=40)
    for i in range(5):
        s.add_request(make_request(f"r{i}", 3 + 2 * i, max_tokens=10 + i, arrival=i))
    mirror = BlockTableMirror()
    outputs: dict[str, list[int]] = {}
    pending: SchedulerOutput | None = None
    placeholders = preemptions = 0
    for _ in range(500):
        if pending is None and not s.has_unfinished_requests():
            break
        launched = None
        if s.has_unfinished_requests():
            assert s.can_schedule_async()
            launched = s.schedule()
            mirror.apply(launched)
            mirror.check(s)
            preemptions += len(launched.preempted_request_ids)
            placeholders += sum(PLACEHOLDER_TOKEN_ID in i.token_ids for i in launched.scheduled_requests)
        if pending is not None:
            sampled = {i.request_id: [default_token(i.request_id, len(outputs.setdefault(i.request_id, [])))]
                       for i in pending.scheduled_requests if i.sample}
            for eco in s.update_from_output(pending, ModelRunnerOutput(sampled_token_ids=sampled)):
                outputs[eco.request_id] += eco.new_token_ids
            mirror.check(s)
        pending = launched
    else:
        raise AssertionError("did not finish")
    assert placeholders > 0 and preemptions > 0
    assert_no_leaks(s)


def test_deltas_survive_msgpack() -> None:
    s, runner = make_scheduler(block_size=4)
    s.add_request(make_request("a", 6, max_tokens=4))
    mirror = BlockTableMirror()
    for _ in range(4):
        out = s.schedule()
        decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(out), type=SchedulerOutput)
        assert decoded == out
        mirror.apply(decoded)
        mirror.check(s)
        s.update_from_output(out, runner.execute(out))
