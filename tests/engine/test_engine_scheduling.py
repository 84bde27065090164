"""Scheduling choices seen from the engine: priority, a custom scheduler class, no leaks, and
the fairness and prefix-cache hash flags."""

from __future__ import annotations

import pytest

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


def test_fairness_and_hash_flags_reach_the_scheduler(llama_dir) -> None:
    import argparse

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args([
        str(llama_dir), "--kv-cache-memory", str(1 << 22), "--long-prefill-token-threshold", "32",
        "--max-num-partial-prefills", "4", "--max-long-partial-prefills", "2",
        "--prefix-caching-hash-algo", "sha256_cbor", "--long-prefill-min-prompt-tokens", "48",
    ])
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))
    scheduler = engine.engine_core.scheduler
    cfg = scheduler.scheduler_config
    assert (cfg.long_prefill_token_threshold, cfg.max_num_partial_prefills, cfg.max_long_partial_prefills) == (32, 4, 2)
    assert cfg.long_prefill_min_prompt_tokens == 48
    assert scheduler.kv_cache_manager.hash_algo == "sha256_cbor"
    engine.add_request("a", "Hello world " * 8, SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert all(isinstance(h, bytes) and len(h) == 32 for h in scheduler.kv_cache_manager.pool._by_hash)
    engine.shutdown()


def test_fairness_and_hash_defaults_on_cpu(llama_dir) -> None:
    from forkless.config import (
        CPU_DEFAULT_LONG_PREFILL_MIN_PROMPT_TOKENS,
        CPU_DEFAULT_LONG_PREFILL_TIME_SHARE,
        CPU_DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD,
        AsyncEngineArgs,
    )

    # The offline engine keeps vLLM's rule (no cap): a batch job has nobody to be fair to.
    offline = EngineArgs(model=str(llama_dir), max_model_len=200).create_engine_config()
    assert offline.scheduler_config.long_prefill_token_threshold == 0
    assert offline.scheduler_config.long_prefill_time_share == 0
    # The server caps a long prefill per step on CPU.
    config = AsyncEngineArgs(model=str(llama_dir), max_model_len=200).create_engine_config()
    cfg = config.scheduler_config
    # Capped by max_model_len: a threshold above it would make no prompt long.
    assert cfg.long_prefill_token_threshold == min(CPU_DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD, 200)
    assert (cfg.max_num_partial_prefills, cfg.max_long_partial_prefills) == (None, 1)
    assert cfg.long_prefill_time_share == CPU_DEFAULT_LONG_PREFILL_TIME_SHARE
    assert cfg.long_prefill_min_prompt_tokens == CPU_DEFAULT_LONG_PREFILL_MIN_PROMPT_TOKENS
    assert offline.scheduler_config.long_prefill_min_prompt_tokens == 0
    assert config.cache_config.prefix_caching_hash_algo == "sha256"
    # vLLM's rule where no CPU default applies: 0, or 4 % of max_model_len with partial prefills > 1.
    unchunked = AsyncEngineArgs(model=str(llama_dir), enable_chunked_prefill=False).create_engine_config()
    assert unchunked.scheduler_config.long_prefill_token_threshold == 0
    assert unchunked.scheduler_config.long_prefill_time_share == 0  # no long prefills to limit
    assert unchunked.scheduler_config.long_prefill_min_prompt_tokens == 0
    explicit = EngineArgs(model=str(llama_dir), long_prefill_token_threshold=0, max_num_partial_prefills=2)
    assert explicit.create_engine_config().scheduler_config.long_prefill_token_threshold == int(256 * 0.04)


@pytest.mark.parametrize("kwargs, match", [
    ({"prefix_caching_hash_algo": "md5"}, "--prefix-caching-hash-algo"),
    ({"long_prefill_token_threshold": -1}, "--long-prefill-token-threshold"),
    ({"long_prefill_time_share": 1.0}, "--long-prefill-time-share"),
    ({"long_prefill_time_share": "half"}, "--long-prefill-time-share"),
    # Offline the threshold is 0 on CPU: no prefill is long, nothing to share.
    ({"long_prefill_time_share": 0.5}, "--long-prefill-time-share 0.5 limits long prefills"),
    ({"long_prefill_min_prompt_tokens": -1}, "--long-prefill-min-prompt-tokens"),
    ({"long_prefill_min_prompt_tokens": 1.5}, "--long-prefill-min-prompt-tokens"),
    ({"long_prefill_min_prompt_tokens": 128}, "--long-prefill-min-prompt-tokens 128 exempts prompts"),
    ({"max_num_partial_prefills": 0}, "--max-num-partial-prefills"),
    ({"max_long_partial_prefills": 0}, "--max-long-partial-prefills"),
    ({"max_num_partial_prefills": 1, "max_long_partial_prefills": 2}, "scheduler flags: max_long_partial_prefills"),
])
def test_bad_fairness_and_hash_flags(llama_dir, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        EngineArgs(model=str(llama_dir), **kwargs).create_engine_config()
