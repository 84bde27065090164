"""Faults: a worker killed mid-request, a client gone mid-stream, shutdown signals.

Each server here gets its own ``TMPDIR``, which must be empty once it is gone: no IPC
directory outlives a server, however it ended.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import plugin_env
from tests.server.conftest import Server, alive, cmdline, descendants, start_server, stop_and_check, wait_until
from tests.server.test_metrics import scrape, value


def _own_tmpdir(tmp_path: Path) -> Path:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    return tmpdir


def test_killed_worker_fails_health_and_requests_then_server_exits(tiny_llama: Path, tmp_path: Path) -> None:
    tmpdir = _own_tmpdir(tmp_path)
    srv = start_server(tiny_llama, tmp_path, "--max-model-len", "512", env_extra={"TMPDIR": str(tmpdir)})
    processes = descendants(srv.proc.pid)
    try:
        _, worker = srv.engine_pids()
        client = srv.client(timeout=60)  # a hang fails the test instead of blocking it
        stream = client.completions.create(model=str(tiny_llama), prompt="Keep going", max_tokens=480,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True})
        os.kill(worker, signal.SIGKILL)  # the request is in the engine: its first output was awaited
        health: list[int] = []

        def probe() -> bool:
            try:
                health.append(httpx.get(srv.url + "/health", timeout=5).status_code)
            except httpx.HTTPError:
                return True  # the server has begun to shut down
            return health[-1] == 503

        assert wait_until(probe, 15, 0.1) and 503 in health, health
        with pytest.raises(openai.APIError) as caught:
            for _ in stream:
                pass
        assert "died" in str(caught.value) or "dead" in str(caught.value), caught.value
        assert srv.proc.wait(60) != 0  # the server notices and shuts itself down
        assert wait_until(lambda: not any(alive(p) for p in processes), 15), \
            [p for p in processes if alive(p)]
        assert "worker 0" in srv.log() and "died" in srv.log()
        assert os.listdir(tmpdir) == []  # the API server removed the IPC directory
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def test_killed_grammar_process_fails_requests_instead_of_hanging(tiny_llama: Path, tmp_path: Path) -> None:
    # The engine core sends to the grammar process through a PUSH socket, which blocks
    # forever once its only peer is gone: the next constrained request must fail (and the
    # server stop), not hang the step loop with /health still answering 200.
    tmpdir = _own_tmpdir(tmp_path)
    srv = start_server(tiny_llama, tmp_path, "--max-model-len", "512", env_extra={"TMPDIR": str(tmpdir)})
    processes = descendants(srv.proc.pid)
    try:
        client = srv.client(timeout=60)  # a hang fails the test instead of blocking it
        constrained = {"structured_outputs": {"regex": "[a-z]{1,8}"}}
        client.completions.create(model=str(tiny_llama), prompt="a word:", max_tokens=8, extra_body=constrained)
        grammar = [p for p in descendants(srv.proc.pid) if "forkless.structured_output.process" in cmdline(p)]
        assert len(grammar) == 1, [cmdline(p) for p in descendants(srv.proc.pid)]
        os.kill(grammar[0], signal.SIGKILL)
        time.sleep(1)  # ZeroMQ has dropped the dead peer: a send now finds no one to queue for
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(model=str(tiny_llama), prompt="another word:", max_tokens=8,
                                      extra_body=constrained)
        assert caught.value.status_code == 503, caught.value
        # The engine core's reason, not only its exit code.
        assert "the grammar process died (exit code -9)" in caught.value.message, caught.value
        assert srv.proc.wait(60) != 0  # the server notices and shuts itself down
        assert wait_until(lambda: not any(alive(p) for p in processes), 15), \
            [p for p in processes if alive(p)]
        assert os.listdir(tmpdir) == []  # nor the grammar process's socket directory
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def test_client_disconnect_aborts_the_request(server: Server) -> None:
    before = scrape(server)
    body = {"model": "tiny", "prompt": "A long story:", "max_tokens": 240, "stream": True,
            "ignore_eos": True, "temperature": 0}
    chunks = 0
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                assert json.loads(line[6:])["choices"]
                chunks += 1
                if chunks == 2:
                    break  # leaving the block closes the connection mid-stream

    def idle() -> bool:
        m = scrape(server)
        return value(m, "forkless:kv_cache_usage_perc") == 0 and value(m, "forkless:num_requests_running") == 0

    assert wait_until(idle, 15)
    after = scrape(server)
    # aborted, not run to the end: far fewer than 240 tokens were generated
    generated = value(after, "forkless:generation_tokens_total") - value(before, "forkless:generation_tokens_total")
    assert generated < 240
    r = server.client().completions.create(model="tiny", prompt="still serving", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3


def test_client_gone_aborts_every_sequence_of_a_multi_prompt_request(server: Server) -> None:
    """Three prompts with ``n=2`` each are six engine requests, read by one task per
    prompt into one response: a client that leaves (mid-stream, or waiting for the whole
    answer) aborts all six, not only the one being read."""
    before = scrape(server)
    body = {"model": "tiny", "prompt": ["One", "Two words", "Three more words"], "n": 2, "max_tokens": 200,
            "ignore_eos": True, "temperature": 1.0}
    chunks = 0
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            chunks += line.startswith("data: {")
            if chunks == 6:
                break
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.5))

    def idle() -> bool:
        m = scrape(server)
        return value(m, "forkless:kv_cache_usage_perc") == 0 and value(m, "forkless:num_requests_running") == 0 \
            and value(m, "forkless:num_requests_waiting") == 0

    assert wait_until(idle, 15)
    generated = value(scrape(server), "forkless:generation_tokens_total") - value(before, "forkless:generation_tokens_total")
    assert generated < 2 * 6 * 200 / 2, generated  # far from every sequence run to its end


def test_client_gone_before_a_constrained_stream_starts_aborts_it(server: Server) -> None:
    """A constrained stream's response starts with its first output (so that a grammar
    the engine refuses is still a 400); a client that leaves before then aborts it too."""
    before = scrape(server)
    # A regex of its own, so that the request waits for its grammar's compilation (not one
    # cached by an earlier run), and that never completes: only an abort ends it early.
    regex = f"(?:{os.urandom(8).hex()})?[ab ]+"
    body = {"model": "tiny", "prompt": "Letters:", "max_tokens": 240, "stream": True, "ignore_eos": True,
            "temperature": 0, "structured_outputs": {"regex": regex}}
    with pytest.raises(httpx.TimeoutException):  # gone (most likely before the first output)
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.005))

    def idle() -> bool:
        m = scrape(server)
        return value(m, "forkless:kv_cache_usage_perc") == 0 and value(m, "forkless:num_requests_running") == 0

    assert wait_until(idle, 15)
    generated = value(scrape(server), "forkless:generation_tokens_total") - value(before, "forkless:generation_tokens_total")
    assert generated < 240
    r = server.client().completions.create(model="tiny", prompt="still serving", max_tokens=3, temperature=0,
                                           stream=True, extra_body={"structured_outputs": {"regex": "[ab ]+"}})
    assert re.fullmatch("[ab ]*", "".join(c.choices[0].text for c in r if c.choices))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_shuts_everything_down_cleanly(tiny_llama: Path, tmp_path: Path, sig: int) -> None:
    tmpdir = _own_tmpdir(tmp_path)
    srv = start_server(tiny_llama, tmp_path, env_extra={"TMPDIR": str(tmpdir)})
    # a request in flight when the signal arrives must not keep the server up
    def stream_until_closed() -> None:
        try:
            for _ in srv.client(timeout=60).completions.create(
                    model=str(tiny_llama), prompt="Going on", max_tokens=200, stream=True,
                    extra_body={"ignore_eos": True}):
                pass
        except openai.APIError:
            pass

    streamer = threading.Thread(target=stream_until_closed)
    streamer.start()
    assert len(descendants(srv.proc.pid)) >= 2  # engine core and worker
    assert stop_and_check(srv, sig) == 0, srv.log()[-3000:]
    streamer.join(60)
    assert not streamer.is_alive()
    assert "Traceback" not in srv.log(), srv.log()[-3000:]
    assert os.listdir(tmpdir) == []


def test_a_worker_that_cannot_start_is_reported_once(tiny_llama: Path, tmp_path: Path) -> None:
    # The worker's error, with its traceback, once: not again in the engine core's log and
    # inside the API server's message.
    proc = subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", str(tiny_llama),
                           "--port", "0", "--kv-cache-dtype", "fp8", "--max-model-len", "128"],
                          env=plugin_env(None, tmp_path), capture_output=True, text=True, timeout=240)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert log.count("worker 0 failed to start: ValueError: --kv-cache-dtype fp8") == 1, log
    assert log.count("Traceback (most recent call last)") == 1, log
