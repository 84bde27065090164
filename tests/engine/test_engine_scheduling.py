"""Scheduling choices seen from the engine: priority, a custom scheduler class, no leaks."""

from __future__ import annotations

from forkless import LLM, SamplingParams
from forkless.engine.llm_engine import LLMEngine
from forkless.config import EngineArgs


def test_priority_policy_runs_lower_priority_values_first(llama_dir) -> None:
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(llama_dir), kv_cache_memory=1 << 22, max_num_seqs=1, scheduling_policy="priority",
    ))
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for rid, prio in (("late", 5), ("first", -1), ("middle", 2), ("second", 0)):
        engine.add_request(rid, "Hello world", params, priority=prio)
    order = []
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if o.finished]
    assert order == ["first", "second", "middle", "late"]


def test_fcfs_policy_keeps_arrival_order(llama_dir) -> None:
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(llama_dir), kv_cache_memory=1 << 22, max_num_seqs=1))
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for rid in ("a", "b", "c"):
        engine.add_request(rid, "Hello world", params)
    order = []
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if o.finished]
    assert order == ["a", "b", "c"]


def test_custom_scheduler_class_by_path(llama_dir) -> None:
    from tests.engine.engine_plugins import CountingScheduler

    before = CountingScheduler.steps
    llm = LLM(str(llama_dir), kv_cache_memory=1 << 22, scheduler_cls="tests.engine.engine_plugins:CountingScheduler")
    assert type(llm.llm_engine.engine_core.scheduler) is CountingScheduler
    llm.generate("Hello", SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert CountingScheduler.steps >= before + 3


def test_abort_and_many_requests_leak_no_blocks(llama_dir) -> None:
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(llama_dir), kv_cache_memory=1 << 18, block_size=4, max_num_seqs=4, max_model_len=96,
    ))
    for i in range(12):
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=5 + 3 * i, stop=["e"] if i % 3 == 0 else None)
        engine.add_request(str(i), "The quick brown fox " * (1 + i % 4), params)
    finished = set()
    for _ in range(4):
        finished |= {o.request_id for o in engine.step() if o.finished}
    assert not finished & {"1", "5"}
    engine.abort_request(["1", "5", "missing"])
    while engine.has_unfinished_requests():
        finished |= {o.request_id for o in engine.step() if o.finished}
    assert finished == {str(i) for i in range(12)} - {"1", "5"}
    engine.step()  # lets the runner drop the state of the last finished requests
    kv = engine.engine_core.scheduler.kv_cache_manager
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_blocks
    assert not engine.engine_core.has_unfinished_requests()
