"""More faults: a worker that dies while the server is idle, a step that fails, a request
that comes just after the engine core died, a stray SIGTERM to the engine's processes.

Each server here gets its own ``TMPDIR``, which must be empty once it is gone.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Server, alive, descendants, start_server, wait_until
from tests.server.test_faults import _own_tmpdir

# probe_plugins:Class, for the servers' workers (this folder on PYTHONPATH).
PROBES = str(Path(__file__).resolve().parent.parent / "engine")


def _complete(url: str, timeout: float = 30, **body: object) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 4, **body},
                      timeout=timeout)


def _stops_leaving_nothing(srv: Server, processes: list[int], tmpdir: Path, clean: bool) -> None:
    """The server exits by itself (0 after a clean stop, else not), and leaves no process
    nor IPC directory behind."""
    code = srv.proc.wait(60)
    assert (code == 0) == clean, (code, srv.log()[-3000:])
    assert wait_until(lambda: not any(alive(p) for p in processes), 15), [p for p in processes if alive(p)]
    assert wait_until(lambda: os.listdir(tmpdir) == [], 10), os.listdir(tmpdir)


def test_a_worker_killed_while_idle_turns_health_503_at_once(tiny_llama: Path, tmp_path: Path) -> None:
    tmpdir = _own_tmpdir(tmp_path)
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", env_extra={"TMPDIR": str(tmpdir)})
    processes = descendants(srv.proc.pid)
    try:
        assert _complete(srv.url).status_code == 200
        _, worker = srv.engine_pids()
        os.kill(worker, signal.SIGKILL)  # no request in flight, none coming
        killed = time.monotonic()
        health: list[httpx.Response] = []

        def unhealthy() -> bool:
            try:
                health.append(httpx.get(srv.url + "/health", timeout=5))
            except httpx.HTTPError:
                return True  # already shutting down
            return health[-1].status_code == 503

        assert wait_until(unhealthy, 10, 0.05), [r.status_code for r in health]
        assert time.monotonic() - killed < 5
        # (The server stays up a second after the engine died, to deliver the errors.)
        assert health[-1].status_code == 503, health[-1].text
        message = health[-1].json()["error"]["message"]
        assert f"worker 0 (pid {worker}) died" in message and "exit code -9" in message, message
        _stops_leaving_nothing(srv, processes, tmpdir, clean=False)  # as for any engine death
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def test_a_failed_step_is_a_one_line_503_naming_the_processor(tiny_llama: Path, tmp_path: Path) -> None:
    tmpdir = _own_tmpdir(tmp_path)
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", "--logits-processors",
                       "probe_plugins:ReturnsNone", env_extra={"TMPDIR": str(tmpdir), "PYTHONPATH": PROBES})
    processes = descendants(srv.proc.pid)
    try:
        resp = _complete(srv.url)
        health = httpx.get(srv.url + "/health", timeout=5)
        for answer in (resp, health):
            assert answer.status_code == 503, answer.text
            message = answer.json()["error"]["message"]
            assert "logits processor probe_plugins.ReturnsNone returned None from apply(): expected a float " \
                   "tensor of the input's shape" in message, message
            # The worker's traceback went to the log, not to the client.
            assert "\n" not in message and "Traceback" not in message and ".py" not in message, message
        _stops_leaving_nothing(srv, processes, tmpdir, clean=False)
        assert "Traceback (most recent call last)" in srv.log() and 'sampler.py", line' in srv.log()
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def test_requests_just_after_the_engine_core_died_get_a_503_at_once(tiny_llama: Path, tmp_path: Path) -> None:
    # They used to wait on a send to the dead engine core (~12 s), then get a plain-text 500.
    tmpdir = _own_tmpdir(tmp_path)
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", env_extra={"TMPDIR": str(tmpdir)})
    processes = descendants(srv.proc.pid)
    try:
        core, _ = srv.engine_pids()
        answers: list[tuple[float, httpx.Response | BaseException]] = []

        def post() -> None:
            began = time.monotonic()
            try:
                answers.append((time.monotonic() - began, _complete(srv.url, timeout=30)))
            except httpx.HTTPError as exc:
                answers.append((time.monotonic() - began, exc))

        os.kill(core, signal.SIGKILL)
        posts = [threading.Thread(target=post) for _ in range(3)]
        for thread in posts:
            thread.start()
        for thread in posts:
            thread.join(60)
        for took, answer in answers:
            assert isinstance(answer, httpx.Response), answer
            assert answer.status_code == 503 and answer.headers["content-type"] == "application/json", answer.text
            assert "the engine core process exited with code -9" in answer.json()["error"]["message"], answer.text
            assert took < 5, took
        assert len(answers) == 3
        _stops_leaving_nothing(srv, processes, tmpdir, clean=False)
        assert "CancelledError" not in srv.log(), srv.log()[-3000:]
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def test_a_stray_sigterm_is_logged_and_a_later_stop_of_the_group_still_drains(tiny_llama: Path,
                                                                             tmp_path: Path) -> None:
    # The engine core and the worker used to remember a stray SIGTERM forever: the next stop
    # of the whole group (systemd's) then ended them at once, failing the drained requests.
    tmpdir = _own_tmpdir(tmp_path)
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", "--max-model-len", "512",
                       "--shutdown-timeout", "30", "--logits-processors", "probe_plugins:SlowSteps",
                       env_extra={"TMPDIR": str(tmpdir), "PYTHONPATH": PROBES}, new_session=True)
    processes = descendants(srv.proc.pid)
    try:
        core, worker = srv.engine_pids()
        os.kill(core, signal.SIGTERM)
        os.kill(worker, signal.SIGTERM)
        assert wait_until(lambda: srv.log().count("got SIGTERM while its parent") == 2, 10), srv.log()[-3000:]
        assert alive(core) and alive(worker)
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        body = {"model": "tiny", "prompt": "Once", "max_tokens": 100, "ignore_eos": True, "stream": True}
        events: list[str] = []
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 1:
                        os.killpg(srv.proc.pid, signal.SIGTERM)  # 100 steps of 20 ms still to run
        assert events[-1] == "[DONE]", events[-3:]
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length", events[-2]
        _stops_leaving_nothing(srv, processes, tmpdir, clean=True)
        log = srv.log()
        assert "waiting up to 30 s for 1 request(s) in flight" in log, log[-3000:]
        assert "ERROR" not in log and "Traceback" not in log, log[-3000:]
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
