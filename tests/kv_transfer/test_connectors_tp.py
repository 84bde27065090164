"""KV connectors across two workers (gloo worker processes, offline engines), split by
tensor parallelism (``-tp 2``: each rank holds half of the KV heads) or pipeline parallelism
(``-pp 2``: each stage holds half of the layers): each rank saves and loads its own part of
every block (two parts per block in the store), a second engine loads the first one's
prefill and answers alike, a part that is corrupt on one rank only is recomputed on both,
and an engine split another way (one rank) finds nothing of it. On SharedStorage
(synchronous) and on a real Redis server (asynchronous loads and saves: a request's
transfer ends when both ranks report it; ``reset_prefix_cache(reset_connector=True)``
deletes both ranks' parts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkless import LLM, SamplingParams
from tests.conftest import make_tiny_model

pytestmark = pytest.mark.slow

PREFIX = [(7 * i) % 3000 + 100 for i in range(500)]  # 500 shared prompt tokens: 31 full blocks + 4
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-1k"), smollm2_folder, max_position_embeddings=1024)


def _engine(model: Path, split: dict, connector: str, role: str, extra: dict) -> LLM:
    return LLM(str(model), **split, max_model_len=1024, kv_cache_memory=32 << 20,
               kv_transfer_config={"kv_connector": connector, "kv_role": role, "kv_connector_extra_config": extra})


def _complete(llm: LLM, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Greedy tokens of each prompt, and the engine's external prefix-cache hits so far (tokens)."""
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], llm.llm_engine.engine_core.make_stats(
    ).kv_transfer.external_prefix_cache_hits


@pytest.mark.parametrize("split", [dict(tensor_parallel_size=2), dict(pipeline_parallel_size=2)],
                         ids=["tp2", "pp2"])
def test_two_rank_engines_share_prefills_through_shared_storage(model: Path, tmp_path: Path, split: dict,
                                                                 capfd: pytest.CaptureFixture) -> None:
    store = tmp_path / "kv"
    extra = {"shared_storage_path": str(store)}
    prompt, other = PREFIX + [11, 12, 13], PREFIX[::-1] + [14, 15]
    first = _engine(model, split, "SharedStorageConnector", "kv_both", extra)
    try:
        (reference,), hits = _complete(first, [prompt])
        parts = set(store.rglob("*.safetensors"))
        (other_reference,), _ = _complete(first, [other])
        other_parts = sorted(set(store.rglob("*.safetensors")) - parts)
    finally:
        first.shutdown()
    assert hits == 0
    assert len(parts) == 2 * (len(prompt) // 16)  # each block once per rank
    assert {p.name.split(".")[-2] for p in parts} == {"r0", "r1"}

    # One rank's part of a block of `other` is corrupt: both ranks compute from there.
    part = next(p for p in other_parts if p.name.endswith(".r1.safetensors"))
    raw = bytearray(part.read_bytes())
    raw[-1] ^= 0xFF
    part.write_bytes(bytes(raw))

    second = _engine(model, split, "SharedStorageConnector", "kv_consumer", extra)
    try:
        got, hits = _complete(second, [prompt])
        assert got == [reference] and hits == (len(prompt) - 1) // 16 * 16
        assert second.llm_engine.engine_core.make_stats().kv_transfer.load_bytes > 0
        capfd.readouterr()
        got, _ = _complete(second, [other])
        assert got == [other_reference]
        assert "checksum mismatch" in capfd.readouterr().err
    finally:
        second.shutdown()
    one_rank = _engine(model, {}, "SharedStorageConnector", "kv_consumer", extra)
    try:
        got, hits = _complete(one_rank, [prompt])
        assert got == [reference] and hits == 0  # blocks split in two are not its blocks
    finally:
        one_rank.shutdown()


def test_two_rank_engines_share_prefills_through_redis(model: Path, redis_url) -> None:
    import redis

    url, _ = redis_url
    prompt = PREFIX + [21, 22]
    first = _engine(model, dict(tensor_parallel_size=2), "RedisConnector", "kv_both", {"url": url})
    try:
        (reference,), _ = _complete(first, [prompt])
    finally:
        first.shutdown()  # its asynchronous saves end before its workers exit
    keys = redis.Redis.from_url(url).keys("forkless:kv:*")
    assert len(keys) == 2 * (len(prompt) // 16)
    second = _engine(model, dict(tensor_parallel_size=2), "RedisConnector", "kv_both", {"url": url})
    try:
        (got,), hits = _complete(second, [prompt])
        assert got == reference and hits == (len(prompt) - 1) // 16 * 16
        # Both ranks' writes end, then every rank's part of every block is deleted.
        assert second.reset_prefix_cache(reset_connector=True) is True
        assert redis.Redis.from_url(url).keys("forkless:kv:*") == []
        (got,), again = _complete(second, [prompt])
        assert got == reference and again == hits  # computed, nothing more loaded
    finally:
        second.shutdown()
