"""KV connectors between real servers: two engines on one SharedStorageConnector folder and
on one Redis server (a real ``redis-server``), the second loading the first's prefill, with
the same greedy output; and the faults (corrupt blocks, an unreachable or vanished store),
which cost a recomputation and a log line, never a request."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import make_tiny_model
from tests.server.conftest import Server, free_port, start_server, stop_and_check, wait_until

pytestmark = pytest.mark.slow

PREFIX = [(7 * i) % 3000 + 100 for i in range(1000)]  # 1,000 shared prompt tokens (62 full blocks + 8)


@pytest.fixture(scope="module")
def model(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-2k"), smollm2_folder, max_position_embeddings=2048)


def serve(model: Path, tmp: Path, connector: str, role: str, extra: dict, *args: str, **config: str) -> Server:
    config = {"kv_connector": connector, "kv_role": role, "kv_connector_extra_config": extra, **config}
    return start_server(model, tmp, "--max-model-len", "2048", "--kv-cache-memory", str(128 << 20),
                        "--kv-transfer-config", json.dumps(config), *args)


def complete(srv: Server, prompt: list[int], max_tokens: int = 8) -> list[str]:
    """A greedy completion of a token prompt: its tokens, as the server's logprobs name them."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    out = client.completions.create(model=srv_model(srv), prompt=prompt, max_tokens=max_tokens, temperature=0,
                                    logprobs=0)
    return out.choices[0].logprobs.tokens


def srv_model(srv: Server) -> str:
    return httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"]


def metrics(srv: Server) -> dict[str, float]:
    text = httpx.get(srv.url + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("forkless:") and not sample.labels.keys() - {"model_name", "engine"}:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def external_hits(srv: Server) -> float:
    return metrics(srv).get("forkless:external_prefix_cache_hits_total", 0.0)


def test_second_engine_loads_the_first_engines_prefill_from_shared_storage(model: Path, tmp_path: Path) -> None:
    store = tmp_path / "kv"
    prompt = PREFIX + [11, 12, 13]
    other = PREFIX[::-1] + [14, 15]  # another prefix: its blocks get corrupted below
    first = serve(model, tmp_path, "SharedStorageConnector", "kv_both", {"shared_storage_path": str(store)})
    try:
        reference = complete(first, prompt)
        assert external_hits(first) == 0  # an empty store: it computed everything
        files = set(store.rglob("*.safetensors"))
        assert len(files) == len(prompt) // 16  # every full prompt block, once
        other_reference = complete(first, other)
        other_files = sorted(set(store.rglob("*.safetensors")) - files, key=lambda p: p.stat().st_mtime_ns)
        assert len(other_files) == len(other) // 16
    finally:
        assert stop_and_check(first) == 0
    second = serve(model, tmp_path, "SharedStorageConnector", "kv_consumer", {"shared_storage_path": str(store)})
    try:
        assert complete(second, prompt) == reference
        assert wait_until(lambda: external_hits(second) == 992, 10), external_hits(second)
        m = metrics(second)
        # It loaded the 62 full blocks and computed only the last 11 tokens.
        assert m["forkless:external_prefix_cache_queries_total"] == 1003
        assert m["forkless:kv_transfer_load_bytes_total"] > 0
        assert m["forkless:prefix_cache_hits_total"] == 0  # not from its own prefix cache
        # A consumer saves nothing.
        assert len(list(store.rglob("*.safetensors"))) == len(files) + len(other_files)

        # A corrupt block in the middle of the other prefix: the blocks before it load,
        # the request computes the rest, the log says why, and the output is the same.
        middle = other_files[len(other_files) // 2]
        raw = bytearray(middle.read_bytes())
        raw[-1] ^= 0xFF  # a flipped bit in the tensor data: only the checksum notices
        middle.write_bytes(bytes(raw))
        assert complete(second, other) == other_reference
        assert "checksum mismatch" in second.log()
        # A missing one: the lookup stops there.
        middle.unlink()
        assert complete(second, [1] + other) == complete(second, [1] + other)
    finally:
        assert stop_and_check(second) == 0


def test_two_engines_on_one_redis_server(model: Path, tmp_path: Path, redis_url) -> None:
    url, proc = redis_url
    first = serve(model, tmp_path, "RedisConnector", "kv_both", {"url": url})
    second = serve(model, tmp_path, "RedisConnector", "kv_both", {"url": url})
    try:
        prompt = PREFIX[::-1] + [21, 22]
        reference = complete(first, prompt)
        import redis

        keys = wait_until(lambda: redis.Redis.from_url(url).keys("forkless:kv:*"), 30)
        assert len(keys) == len(prompt) // 16
        assert complete(second, prompt) == reference
        # (The stats reach /metrics with the engine's next report: poll.)
        assert wait_until(lambda: external_hits(second) == (len(prompt) - 1) // 16 * 16, 10), external_hits(second)
        # Streaming out of a loaded prefix gives the same text.
        streamed_prompt = [3, 4] + PREFIX
        plain = openai.OpenAI(base_url=first.url + "/v1", api_key="none").completions.create(
            model=srv_model(first), prompt=streamed_prompt, max_tokens=8, temperature=0).choices[0].text
        assert wait_until(lambda: len(redis.Redis.from_url(url).keys("forkless:kv:*")) == len(keys) * 2, 30), \
            len(redis.Redis.from_url(url).keys("forkless:kv:*"))
        client = openai.OpenAI(base_url=second.url + "/v1", api_key="none")
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=srv_model(second), prompt=streamed_prompt, max_tokens=8, temperature=0, stream=True))
        assert streamed == plain
        assert wait_until(lambda: external_hits(second) == 2 * 992, 10), external_hits(second)

        # The store goes away: requests still complete (computed), and the log says why.
        proc.terminate()
        proc.wait(10)
        again = [8, 8] + PREFIX
        assert complete(second, again) == complete(first, again)
        assert wait_until(lambda: "lookup failed" in second.log() or "failed" in second.log(), 10)
        assert httpx.get(second.url + "/health", timeout=10).status_code == 200
    finally:
        assert stop_and_check(first) == 0
        assert stop_and_check(second) == 0


def test_unreachable_redis_computes_and_logs(model: Path, tmp_path: Path) -> None:
    srv = serve(model, tmp_path, "RedisConnector", "kv_both", {"url": f"redis://127.0.0.1:{free_port()}",
                                                              "timeout_seconds": 0.5})
    try:
        started = time.monotonic()
        tokens = complete(srv, PREFIX[:300])
        assert len(tokens) == 8
        assert time.monotonic() - started < 30
        assert "lookup failed, computing prompts without it for 1 s" in srv.log()
        assert external_hits(srv) == 0
    finally:
        assert stop_and_check(srv) == 0


def test_a_failed_load_fails_the_request_under_vllms_fail_policy(model: Path, tmp_path: Path) -> None:
    store = tmp_path / "kv"
    # No local prefix cache: every request looks its prompt up in the store.
    srv = serve(model, tmp_path, "SharedStorageConnector", "kv_both", {"shared_storage_path": str(store)},
                "--no-enable-prefix-caching", kv_load_failure_policy="fail")
    try:
        prompt = PREFIX[:500]
        complete(srv, prompt)  # computed, and its blocks saved
        assert complete(srv, prompt)  # loaded
        assert wait_until(lambda: external_hits(srv) > 0, 10)
        middle = sorted(store.rglob("*.safetensors"))[10]
        middle.write_bytes(middle.read_bytes()[:-8])  # truncated: the load notices
        body = {"model": srv_model(srv), "prompt": prompt, "max_tokens": 4}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 500, r.text
        error = r.json()["error"]
        assert error["type"] == "InternalServerError" and "kv_load_failure_policy is 'fail'" in error["message"]
        # Streamed: the stream ends with the error event.
        with httpx.stream("POST", srv.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as s:
            events = [line for line in s.iter_lines() if line.startswith("data: ")]
        assert '"code": 500' in events[-2] and "kv_load_failure_policy" in events[-2] and events[-1] == "data: [DONE]"
        # Only those requests: the server goes on.
        assert len(complete(srv, PREFIX[::-1][:100])) == 8
        assert "failing it (kv_load_failure_policy 'fail')" in srv.log()
    finally:
        assert stop_and_check(srv) == 0
