"""KV connectors on the GPU: a second engine loads the first's prompt blocks through
``SharedStorageConnector`` (sync, before the forward pass) and ``RedisConnector`` (async,
between steps) into its CUDA cache, with CUDA graphs on for its decode steps.

The reference is the first engine's own second pass over the same prompts: a prefix-cache
hit on the same blocks, so the same tokens are computed over the same cached context. The
loaded run must equal it token for token. (Against the first pass, which computed each
prompt whole, a random model's greedy tokens may differ at a near tie: the last block's
attention over a cache is rounded differently from the same rows inside one causal pass.)"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.server.conftest import free_port

PROMPTS = [{"prompt_token_ids": [(37 * i + 11 * j) % 20000 + 100 for i in range(300 + 50 * j)]} for j in range(4)]
#: Full 16-token blocks of each prompt short of its last token: what a cache hit covers.
CACHED = [(len(p["prompt_token_ids"]) - 1) // 16 * 16 for p in PROMPTS]


def _run(model, kv_transfer_config: dict, passes: int = 1) -> tuple[list[tuple[list[list[int]], list[int]]], object]:
    """``passes`` generations of ``PROMPTS`` in one engine: each pass's greedy tokens and
    cached prompt tokens, and the engine's KV-transfer stats."""
    from forkless import LLM, SamplingParams

    llm = LLM(str(model), dtype="bfloat16", max_model_len=1024, kv_cache_memory=1 << 30, max_num_seqs=8,
              attention_backend="triton", kv_transfer_config=kv_transfer_config)
    try:
        results = []
        for _ in range(passes):
            outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
                                use_tqdm=False)
            results.append(([list(o.outputs[0].token_ids) for o in outs], [o.num_cached_tokens for o in outs]))
        runner = llm.llm_engine.engine_core.executor.worker.model_runner
        assert runner.graphs is not None  # the built-ins keep decode graphs on
        return results, llm.llm_engine.engine_core.make_stats().kv_transfer
    finally:
        llm.shutdown()


def _check_loaded(model, config: dict) -> object:
    """The first engine stores its prompts' KV and then hits its own prefix cache; a second
    engine loads the stored KV. Returns the second engine's KV-transfer stats."""
    ((first, cached), (reference, local_hit)), _ = _run(model, config, passes=2)
    assert cached == [0, 0, 0, 0]
    assert local_hit == CACHED
    [(loaded, cached)], stats = _run(model, config)
    assert cached == CACHED
    assert loaded == reference
    return stats


def test_shared_storage_on_cuda(real_size_model, tmp_path) -> None:
    config = {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}}
    assert _check_loaded(real_size_model, config).load_bytes > 0


def test_redis_on_cuda(real_size_model, tmp_path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed on this machine")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        _check_loaded(real_size_model, {"kv_connector": "RedisConnector",
                                        "kv_connector_extra_config": {"url": f"redis://127.0.0.1:{port}"}})
    finally:
        proc.terminate()
        proc.wait(10)
