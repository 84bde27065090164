"""One client with many connections does not starve another (a real server, real clients).

The API server keys each request on its client (the OpenAI ``user`` field, else the peer
address) and, while other clients have requests in the engine, the scheduler gives one
client's prompts ``--max-prefill-tokens-per-client`` tokens a step on average (bursts of
twice that). Here client A floods the server with prompts from 127.0.0.2 (or under its own
``user``) while client B, from 127.0.0.1, has a stream running and sends one short
request. Count-based, not timed: when B's short request is answered, how many of A's
requests are done. Without the share, A's prompts all prefill in the first steps after
they arrive (2,048-token budget) and every one of them is done before B's request, which
arrived after them (the last case, one client, shows it); with it, A computes 4 prompt
tokens a step, one prompt every ~14 steps, and B's request needs about 5 steps.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from forkless.config import CPU_DEFAULT_MAX_PREFILL_TOKENS_PER_CLIENT, AsyncEngineArgs, EngineArgs
from tests.server.conftest import Server, start_server, stop_and_check

FLOOD = 48  # client A's requests, all in flight at once
PROMPT = 60  # tokens each: under the 64-token long-prefill threshold, so only the share limits them
CAP = 4  # the test server's --max-prefill-tokens-per-client: ~14 steps a prompt


def test_the_server_shares_prefill_per_client_on_cpu_and_the_offline_engine_does_not(tiny_llama: Path) -> None:
    server = AsyncEngineArgs(model=str(tiny_llama)).create_engine_config().scheduler_config
    assert server.max_prefill_tokens_per_client == CPU_DEFAULT_MAX_PREFILL_TOKENS_PER_CLIENT > 0
    offline = EngineArgs(model=str(tiny_llama)).create_engine_config().scheduler_config
    assert offline.max_prefill_tokens_per_client == 0
    explicit = AsyncEngineArgs(model=str(tiny_llama), max_prefill_tokens_per_client=0).create_engine_config()
    assert explicit.scheduler_config.max_prefill_tokens_per_client == 0


@pytest.mark.parametrize("value", [-1, 2.5, "8"])
def test_a_bad_flag_is_refused_naming_it(tiny_llama: Path, value: object) -> None:
    with pytest.raises(ValueError, match=r"--max-prefill-tokens-per-client=.* expected an integer >= 0"):
        EngineArgs(model=str(tiny_llama), max_prefill_tokens_per_client=value).create_engine_config()


async def _in_engine(client: httpx.AsyncClient) -> float:
    metrics = (await client.get("/metrics")).text
    return sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith(("forkless:num_requests_running", "forkless:num_requests_waiting")))


async def _flood_then_short(url: str, a_address: str, a_user: str | None, b_user: str | None) -> tuple[int, int]:
    """``(A's requests done when B's short request was answered, A's requests)``."""
    a_done = 0
    b = httpx.AsyncClient(base_url=url, timeout=300)
    a = httpx.AsyncClient(base_url=url, timeout=300, transport=httpx.AsyncHTTPTransport(
        local_address=a_address, limits=httpx.Limits(max_connections=FLOOD)))
    user_a = {"user": a_user} if a_user else {}
    user_b = {"user": b_user} if b_user else {}
    b_streaming = asyncio.Event()

    async def b_stream() -> None:
        # B's long stream: B has a request in the engine all along.
        body = {"model": "tiny", "prompt": [7, 8, 9], "max_tokens": 200, "ignore_eos": True, "stream": True,
                **user_b}
        async with b.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for _ in r.aiter_lines():
                b_streaming.set()

    async def a_request(i: int) -> None:
        nonlocal a_done
        body = {"model": "tiny", "prompt": [100 + (i * PROMPT + j) % 900 for j in range(PROMPT)], "max_tokens": 1,
                "temperature": 0, **user_a}
        r = await a.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        a_done += 1

    stream = asyncio.create_task(b_stream())
    try:
        await asyncio.wait_for(b_streaming.wait(), 120)
        flood = [asyncio.create_task(a_request(i)) for i in range(FLOOD)]
        # B's short request goes out once A's requests are all in the engine (queued
        # ahead of it), or done.
        for _ in range(3000):
            if a_done + await _in_engine(b) >= FLOOD + 1:
                break
            await asyncio.sleep(0.01)
        r = await b.post("/v1/completions", json={"model": "tiny", "prompt": [11, 12], "max_tokens": 4,
                                                  "ignore_eos": True, "temperature": 0, **user_b})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        done_then = a_done
        await asyncio.gather(*flood)
        assert a_done == FLOOD
        return done_then, FLOOD
    finally:
        stream.cancel()
        await asyncio.gather(stream, return_exceptions=True)
        await a.aclose()
        await b.aclose()


@pytest.fixture(scope="module")
def fair_server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Server:
    srv = start_server(tiny_llama, tmp_path_factory.mktemp("fair"), "--served-model-name", "tiny",
                       "--max-prefill-tokens-per-client", str(CAP), "--max-num-seqs", "128")
    yield srv
    assert stop_and_check(srv) == 0


@pytest.mark.parametrize("a_address, a_user, b_user", [
    ("127.0.0.2", None, None),  # two machines: told apart by address
    ("127.0.0.1", "alice", "bob"),  # one proxy, two users: told apart by the user field
], ids=["by-address", "by-user"])
def test_a_short_request_is_not_starved_by_another_clients_flood(
        fair_server: Server, a_address: str, a_user: str | None, b_user: str | None) -> None:
    done_then, total = asyncio.run(_flood_then_short(fair_server.url, a_address, a_user, b_user))
    # ~5 steps for B's request against ~14 a prompt of A's: a handful at most, whatever the
    # machine's speed (both wait for the same steps). Without the share: all 48.
    assert done_then < total // 2, f"{done_then} of A's {total} requests were done before B's short one"


def test_one_client_is_not_limited(fair_server: Server) -> None:
    # The same load from one client (one address, no user): nothing to share with, and
    # A's prompts run at full speed, all done before B's request that came after them.
    # (It also shows the test above can fail.)
    done_then, total = asyncio.run(_flood_then_short(fair_server.url, "127.0.0.1", None, None))
    assert done_then >= total // 2, f"only {done_then} of A's {total} requests were done before B's short one"
