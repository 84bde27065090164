"""A request with 100,000 stop strings does not slow the other requests down.

Stop strings are matched in the API server's output path, which every request's tokens
go through: a per-token scan of every stop string (as before) made each step of every
request wait for it.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_tiny_model
from tests.server.conftest import start_server, stop_and_check, wait_until

NUM_STOP = 100_000
HEAVY = 4  # requests with NUM_STOP stop strings each, streaming while the light one runs


@pytest.fixture(scope="module")
def long_context_llama(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with room for 4,000-token generations: the heavy requests outlast
    the measurement whatever the machine's speed."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-4k"), smollm2_folder,
                           max_position_embeddings=4096)


def _light_latency(url: str) -> float:
    """Seconds for a 16-token completion (the best of three: the machine is shared)."""
    best = float("inf")
    for _ in range(3):
        start = time.monotonic()
        r = httpx.post(url + "/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": "Light", "max_tokens": 16, "ignore_eos": True, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16, r.text
        best = min(best, time.monotonic() - start)
    return best


def test_many_stop_strings_do_not_slow_other_requests(long_context_llama: Path, tmp_path: Path) -> None:
    srv = start_server(long_context_llama, tmp_path, "--served-model-name", "tiny", "--max-model-len", "4096")
    stop_streaming = threading.Event()
    threads: list[threading.Thread] = []
    started = [threading.Event() for _ in range(HEAVY)]
    errors: list[str] = []

    def heavy(i: int) -> None:
        # Strings the random model will not write, of a dozen lengths (as real lists have).
        stop = [f"\u2603{i}-{n}" + "#" * (n % 12) for n in range(NUM_STOP)]
        body = {"model": "tiny", "prompt": f"Heavy {i}", "max_tokens": 4000, "ignore_eos": True,
                "stream": True, "stop": stop}
        try:
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=300) as resp:
                if resp.status_code != 200:
                    errors.append(f"{resp.status_code}: {resp.read()[:300]!r}")
                    return
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        assert "error" not in json.loads(line[6:]), line
                        started[i].set()
                    if stop_streaming.is_set():
                        return  # closing the stream aborts the request
        except httpx.HTTPError as exc:
            errors.append(repr(exc))
        finally:
            started[i].set()

    try:
        idle = _light_latency(srv.url)
        threads += [threading.Thread(target=heavy, args=(i,)) for i in range(HEAVY)]
        for t in threads:
            t.start()
        # Measured once they all stream: their one-off costs (parsing the body) are past.
        assert wait_until(lambda: all(e.is_set() for e in started), 120)
        assert not errors, errors
        loaded = _light_latency(srv.url)
        assert all(t.is_alive() for t in threads), "the heavy requests ended before the measurement"
        assert loaded < 4 * idle + 1.0, (
            f"a 16-token request took {loaded:.2f} s next to {HEAVY} requests with {NUM_STOP} stop "
            f"strings each, {idle:.2f} s alone")
        # Over-long stop strings are refused before anything is generated.
        r = httpx.post(srv.url + "/v1/completions", timeout=30,
                       json={"model": "tiny", "prompt": "x", "max_tokens": 2, "stop": ["y" * 5000]})
        assert r.status_code == 400 and "at most" in r.json()["error"]["message"], r.text
    finally:
        stop_streaming.set()
        for t in threads:
            t.join(60)
        assert stop_and_check(srv) == 0, srv.log()[-3000:]
