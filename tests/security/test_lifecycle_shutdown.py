"""Lifecycle: the port is taken before the model loads, and SIGTERM drains.

With ``--shutdown-timeout`` the requests in flight when SIGTERM arrives may finish, also
when the signal goes to the whole process group (systemd's stop: the engine core and
workers get it too, and leave the shutdown to the API server); when
the timeout is over, the rest end with an OpenAI error (an SSE error event and
``[DONE]`` on a stream, a JSON 503 otherwise), and the server exits 0 with no traceback
in its log and no IPC directory left behind.

What a load balancer sees during the drain: the listening socket is closed, so a health
check on a new connection is refused, and an idle keep-alive connection is closed without
an answer; a ``/health`` that still reaches the application after the signal (already
read on an open connection, or in the instant before the listener closes) is a 503 with
the OpenAI error body, never a 200.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_tiny_model, plugin_env
from tests.server.conftest import Server, alive, descendants, start_server, wait_until
from tests.server.test_metrics import scrape, value

GRACE = 12  # --shutdown-timeout: far more than SHORT tokens take, far less than LONG do
SHORT = 24
LONG = 4000


@pytest.fixture(scope="module")
def long_context_llama(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with room for 4,000-token generations, which outlast GRACE."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-4k"), smollm2_folder,
                           max_position_embeddings=4096)


class Call:
    """One completion request run in a thread; what it got back."""

    def __init__(self, srv: Server, max_tokens: int, stream: bool) -> None:
        self.body = {"model": "tiny", "prompt": f"Go on {max_tokens}", "max_tokens": max_tokens,
                     "ignore_eos": True, "stream": stream}
        self.url = srv.url + "/v1/completions"
        self.status: int | None = None
        self.events: list[str] = []  # the data of each SSE event
        self.json: dict | None = None
        self.failure: str | None = None
        self.first_event = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            if self.body["stream"]:
                with httpx.stream("POST", self.url, json=self.body, timeout=120) as resp:
                    self.status = resp.status_code
                    for line in resp.iter_lines():
                        if line.startswith("data: "):
                            self.events.append(line[6:])
                            self.first_event.set()
            else:
                resp = httpx.post(self.url, json=self.body, timeout=120)
                self.status, self.json = resp.status_code, resp.json()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.failure = repr(exc)
        finally:
            self.first_event.set()

    def result(self) -> "Call":
        self.thread.join(120)
        assert not self.thread.is_alive() and self.failure is None, self.failure
        return self


def _second_server_fails_fast(srv: Server, model: Path, tmp_path: Path, tmpdir: Path, first_start: float) -> None:
    """A second server on the same port fails at once, before anything loads."""
    env = plugin_env(None, tmp_path, FORKLESS_PLUGINS="", TMPDIR=str(tmpdir))
    start = time.monotonic()
    second = subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", str(model),
                             "--port", str(srv.port)], env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    output = second.stdout + second.stderr
    assert second.returncode != 0, output
    assert f"port {srv.port} on 127.0.0.1 is already in use" in output, output
    assert "engine core" not in output and "tokenizer" not in output, output  # nothing started
    # The first server took its whole start-up; the second one only its imports.
    assert elapsed < first_start / 3, f"the second server took {elapsed:.1f} s to fail ({first_start:.1f} s to start)"


def test_sigterm_lets_requests_finish_then_ends_the_rest(long_context_llama: Path, tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    began = time.monotonic()
    srv = start_server(long_context_llama, tmp_path, "--served-model-name", "tiny", "--max-model-len", "4096",
                       "--shutdown-timeout", str(GRACE), env_extra={"TMPDIR": str(tmpdir)}, new_session=True)
    first_start = time.monotonic() - began
    try:
        _second_server_fails_fast(srv, long_context_llama, tmp_path, tmpdir, first_start)
        long_calls = [Call(srv, LONG, stream=True), Call(srv, LONG, stream=False),
                      Call(srv, LONG, stream=True), Call(srv, LONG, stream=False)]
        short_calls = [Call(srv, SHORT, stream=True), Call(srv, SHORT, stream=False)]
        running = lambda: value(scrape(srv), "forkless:num_requests_running")  # noqa: E731
        assert wait_until(lambda: running() >= 6, 60, 0.05), (
            f"the requests did not all start: {running()} running; calls (status, failure): "
            f"{[(c.status, c.failure) for c in long_calls + short_calls]}")
        assert all(c.first_event.is_set() and c.events for c in long_calls + short_calls if c.body["stream"])
        # A load balancer's keep-alive connection, idle after a health check.
        idle = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: lb\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200 "), "healthy before SIGTERM"
        processes = descendants(srv.proc.pid)
        os.killpg(srv.proc.pid, signal.SIGTERM)  # every process of the server, as systemd stops it
        signalled = time.monotonic()

        def refused() -> bool:
            try:
                httpx.get(srv.url + "/health", timeout=2)
            except httpx.ConnectError:
                return True
            except httpx.HTTPError:
                pass
            return False

        assert wait_until(refused, 10, 0.1), "new connections were still accepted after SIGTERM"
        # The idle connection is closed by the server, with no answer (a 503 at most).
        with idle:
            try:
                idle.sendall(b"GET /health HTTP/1.1\r\nHost: lb\r\n\r\n")
                answer = idle.recv(4096)
            except OSError:  # reset: closed before the request arrived
                answer = b""
            assert answer == b"" or answer.startswith(b"HTTP/1.1 503 "), answer
        assert srv.proc.wait(GRACE + 60) == 0, srv.log()[-3000:]
        took = time.monotonic() - signalled
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    assert wait_until(lambda: not any(alive(p) for p in processes), 15)
    assert GRACE - 1 < took < GRACE + 30, f"exited {took:.1f} s after SIGTERM"

    stream, plain = (c.result() for c in short_calls)  # finished normally
    assert json.loads(stream.events[-2])["choices"][0]["finish_reason"] == "length" and stream.events[-1] == "[DONE]"
    assert plain.status == 200 and plain.json["usage"]["completion_tokens"] == SHORT, plain.json
    for call in (c.result() for c in long_calls):  # ended with an OpenAI error
        if call.body["stream"]:
            assert call.status == 200 and len(call.events) > 2 and call.events[-1] == "[DONE]", call.events[-3:]
            error = json.loads(call.events[-2])["error"]
        else:
            assert call.status == 503, call.json
            error = call.json["error"]
        assert error["code"] == 503 and error["type"] == "ServiceUnavailableError", error
        assert "shutting down" in error["message"] and "--shutdown-timeout" in error["message"], error
    log = srv.log()
    assert "Traceback" not in log and "ERROR" not in log, log[-5000:]
    assert sorted(os.listdir(tmpdir)) == [], "left in TMPDIR"


def test_health_is_503_from_the_signal_on() -> None:
    """The signal handler marks the app as shutting down at once: a ``/health`` that the
    application still answers is a 503 with the OpenAI error body, and new requests are
    refused; before it, ``/health`` is an empty 200."""
    import uvicorn
    from fastapi.testclient import TestClient

    from forkless.entrypoints.cli.serve import _Server
    from forkless.entrypoints.openai.api_server import build_app

    class Engine:  # what build_app, /health and the signal handler use
        errored = False
        dead_reason = None
        stopped = False

        def stop_accepting(self) -> None:
            self.stopped = True

    engine = Engine()
    app = build_app(engine, ["tiny"], 256)  # type: ignore[arg-type]
    client = TestClient(app)
    ok = client.get("/health")
    assert ok.status_code == 200 and ok.content == b""
    server = _Server(uvicorn.Config(app), "tiny", engine, shutdown_timeout=5)
    server.request_exit(signal.SIGTERM)
    assert server.should_exit and engine.stopped
    resp = client.get("/health")
    assert resp.status_code == 503 and resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert error == {"message": error["message"], "type": "ServiceUnavailableError", "param": None, "code": 503}
    assert error["message"].startswith("server is shutting down"), error
