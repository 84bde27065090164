"""The model runner's persistent block tables, kept from the scheduler's block-id deltas.

The scheduler sends a request's whole block table once, at (re)admission, and afterwards
only the ids appended since (``ScheduledRequest.new_block_ids``). These tests run the real
CPU runner under a real scheduler and check after every step that the runner's rows equal
the scheduler's tables, and that the CUDA-graph decode path's host inputs (built from the
same rows, so checkable without a GPU) equal the eager path's.
"""

from __future__ import annotations

import numpy as np
import pytest

from forkless import LLM, SamplingParams
from forkless.protocol.step import PLACEHOLDER_TOKEN_ID
from forkless.worker.cuda_graphs import gather_block_rows
from tests.engine.test_engine_parity import PROMPTS

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
# 16 blocks of 4 tokens with 3 running requests: they preempt each other (see test_engine_parity).
TINY_KV = {"block_size": 4, "max_model_len": 64, "max_num_seqs": 3, "kv_cache_memory": 16 * 4 * 2 * 2 * 2 * 16 * 4}


def _checked_engine(llama_dir, **kwargs) -> tuple[LLM, dict[str, int]]:
    """An engine whose runner checks its block tables and decode inputs every step."""
    kwargs.setdefault("kv_cache_memory", 1 << 22)
    llm = LLM(str(llama_dir), dtype="float32", **kwargs)
    core = llm.llm_engine.engine_core
    runner = core.executor.worker.model_runner
    scheduler = core.scheduler
    counts = {"steps": 0, "decode_steps": 0, "block_ids_sent": 0}
    update = runner._update_states

    def checked_update(so) -> None:  # noqa: ANN001 - SchedulerOutput
        update(so)
        counts["steps"] += 1
        counts["block_ids_sent"] += sum(len(s.new_block_ids) for s in so.scheduled_requests)
        # Every request the scheduler runs is held by the runner, with the same table.
        rows = set()
        for request in scheduler.running:
            state = runner.requests[request.request_id]
            row = runner.block_table[state.table_row]
            assert row[: state.num_blocks].tolist() == request.block_ids, request.request_id
            assert not row[state.num_blocks :].any(), "padding past a row's blocks must be 0"
            rows.add(state.table_row)
        assert len(rows) == len(scheduler.running), "two requests share a table row"
        steps = so.scheduled_requests
        if steps and all(len(s.token_ids) == 1 and s.sample for s in steps):
            _check_decode_inputs(runner, steps)
            counts["decode_steps"] += 1

    runner._update_states = checked_update
    return llm, counts


def _check_decode_inputs(runner, steps) -> None:  # noqa: ANN001
    """The decode graphs' inputs equal what the eager path computes for the same rows."""
    input_ids, positions, slots, seq_lens, table_rows = runner._decode_inputs(steps)
    ids_dev, positions_dev, md, _ = runner._prepare_inputs(steps)
    known = input_ids != PLACEHOLDER_TOKEN_ID
    assert (input_ids[known] == ids_dev.cpu().numpy()[known]).all()
    assert positions.tolist() == positions_dev.tolist()
    assert slots.tolist() == md.slot_mapping.tolist()
    assert seq_lens.tolist() == md.seq_lens.tolist()
    # What DecodeGraphs.run stages for the device: whole rows, of the graphs' width.
    staged = np.full((len(steps), runner.block_table.shape[1]), -1, dtype=np.int32)
    gather_block_rows(runner.block_table, table_rows, staged)
    width = md.block_tables.shape[1]
    assert staged[:, :width].tolist() == md.block_tables.tolist()
    assert not staged[:, width:].any()


def _generate(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def expected(llama_dir) -> list[list[int]]:
    return _generate(LLM(str(llama_dir), dtype="float32", kv_cache_memory=1 << 22))


@pytest.mark.parametrize("kwargs", [
    {},
    TINY_KV,
    {"max_num_batched_tokens": 7, "enable_chunked_prefill": True},
    {"block_size": 4, "enable_prefix_caching": True},
], ids=["plain", "preemption", "chunked", "prefix-cache"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_runner_tables_follow_the_deltas(llama_dir, expected, kwargs, async_scheduling: bool) -> None:
    llm, counts = _checked_engine(llama_dir, async_scheduling=async_scheduling, **kwargs)
    assert _generate(llm) == expected
    assert _generate(llm) == expected  # a second round: prefix hits, rows reused
    assert counts["decode_steps"] > 0
    runner = llm.llm_engine.engine_core.executor.worker.model_runner
    if kwargs is TINY_KV:
        assert llm.llm_engine.make_stats().num_preemptions > 0
    else:
        # Without preemption each allocated block id crosses to the runner exactly once.
        bs = llm.llm_engine.config.cache_config.block_size
        tok = llm.get_tokenizer()
        per_round = sum(-(-(len(tok.encode(p)) + GREEDY.max_tokens - 1) // bs) for p in PROMPTS)
        assert counts["block_ids_sent"] == 2 * per_round
    # Every row went back: a finished request's row is freed and zeroed.
    llm.generate(["x"], SamplingParams(max_tokens=1), use_tqdm=False)
    assert len(runner.requests) <= 1
    assert not runner.block_table[[r for r in range(len(runner.block_table))
                                   if r not in {s.table_row for s in runner.requests.values()}]].any()


def test_gather_block_rows_widths() -> None:
    table = np.arange(12, dtype=np.int32).reshape(3, 4)
    out = np.zeros((2, 4), dtype=np.int32)
    gather_block_rows(table, np.array([2, 0]), out)
    assert out.tolist() == [[8, 9, 10, 11], [0, 1, 2, 3]]
    narrow = np.zeros((2, 3), dtype=np.int32)
    gather_block_rows(table, np.array([1, 1]), narrow)
    assert narrow.tolist() == [[4, 5, 6], [4, 5, 6]]
    wide = np.full((1, 6), 7, dtype=np.int32)
    gather_block_rows(table, np.array([0]), wide)
    assert wide.tolist() == [[0, 1, 2, 3, 7, 7]]


def test_runner_rejects_a_running_request_with_too_few_blocks(llama_dir) -> None:
    from forkless.protocol.step import ScheduledRequest, SchedulerOutput

    llm = LLM(str(llama_dir), dtype="float32", kv_cache_memory=1 << 22, block_size=4)
    runner = llm.llm_engine.engine_core.executor.worker.model_runner
    params = SamplingParams(max_tokens=4)
    runner.execute_model(SchedulerOutput([ScheduledRequest(
        "r", [5, 6, 7], 0, [3], True, True, params, [5, 6, 7], [])], 3))
    # The next token fits block 3; the one after needs a block the scheduler never sent.
    runner.execute_model(SchedulerOutput([ScheduledRequest("r", [9], 3, [], False, True)], 1))
    with pytest.raises(RuntimeError, match="too few"):
        runner.execute_model(SchedulerOutput([ScheduledRequest("r", [9], 4, [], False, True)], 1))
