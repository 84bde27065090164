"""KV connectors on the GPU: a second engine loads the first's prompt blocks through
``SharedStorageConnector`` (sync, before the forward pass) and ``RedisConnector`` (async,
between steps) into its CUDA cache, with CUDA graphs on for its decode steps, and its greedy
output equals the first engine's, which computed everything."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.server.conftest import free_port


def _run(model, kv_transfer_config: dict) -> tuple[list[list[int]], list[int], object]:
    from forkless import LLM, SamplingParams

    llm = LLM(str(model), dtype="bfloat16", max_model_len=1024, kv_cache_memory=1 << 30, max_num_seqs=8,
              attention_backend="triton", kv_transfer_config=kv_transfer_config)
    try:
        prompts = [{"prompt_token_ids": [(37 * i + 11 * j) % 20000 + 100 for i in range(300 + 50 * j)]}
                   for j in range(4)]
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
                            use_tqdm=False)
        runner = llm.llm_engine.engine_core.executor.worker.model_runner
        assert runner.graphs is not None  # the built-ins keep decode graphs on
        return [list(o.outputs[0].token_ids) for o in outs], [o.num_cached_tokens for o in outs], \
            llm.llm_engine.engine_core.make_stats().kv_transfer
    finally:
        llm.shutdown()


def test_shared_storage_on_cuda(real_size_model, tmp_path) -> None:
    config = {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}}
    first, cached, _ = _run(real_size_model, config)
    assert cached == [0, 0, 0, 0]
    second, cached, stats = _run(real_size_model, config)
    assert second == first
    assert cached == [(300 + 50 * j - 1) // 16 * 16 for j in range(4)]
    assert stats.load_bytes > 0


def test_redis_on_cuda(real_size_model, tmp_path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed on this machine")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        config = {"kv_connector": "RedisConnector", "kv_connector_extra_config": {"url": f"redis://127.0.0.1:{port}"}}
        first, _, _ = _run(real_size_model, config)
        second, cached, _ = _run(real_size_model, config)
        assert second == first
        assert cached == [(300 + 50 * j - 1) // 16 * 16 for j in range(4)]
    finally:
        proc.terminate()
        proc.wait(10)
