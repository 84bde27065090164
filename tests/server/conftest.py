"""Fixtures that start ``forkless serve`` as a real subprocess on a loopback port."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.conftest import plugin_env


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now, never the same twice in a session: the kernel may
    give the same free port again before the process it was chosen for has bound it
    (two proxies started back to back were handed one port)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def children_of(pid: int) -> list[int]:
    """Direct children of a process (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children_of(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log_path: Path
    api_key: str | None = None
    extra: dict = field(default_factory=dict)
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def client(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key or "unused", max_retries=0, **kwargs)

    def async_client(self, **kwargs):
        import openai

        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=self.api_key or "unused", max_retries=0, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def engine_pids(self) -> tuple[int, int]:
        """``(engine core pid, worker pid)``: the spawned processes below the server."""
        for child in children_of(self.proc.pid):
            if "resource_tracker" in cmdline(child):
                continue
            workers = [g for g in children_of(child) if "resource_tracker" not in cmdline(g)]
            if workers:
                return child, workers[0]
        raise AssertionError(f"no engine core / worker below pid {self.proc.pid}")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"server did not stop within {timeout} s after SIGTERM\n{self.log()[-3000:]}")


def start_server(model: Path | str, tmp_path: Path, *args: str, site: Path | None = None,
                 env_extra: dict[str, str] | None = None, api_key: str | None = None,
                 timeout: float = 240, scheme: str = "http", new_session: bool = False) -> Server:
    port = free_port()
    log_path = tmp_path / f"server-{port}.log"
    env = plugin_env(site, tmp_path, **{"FORKLESS_PLUGINS": os.environ.get("FORKLESS_PLUGINS_FOR_TESTS", ""),
                                        **(env_extra or {})})
    cmd = [sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", str(model), "--port", str(port),
           "--max-model-len", "256", "--kv-cache-memory", str(64 << 20), "--max-num-seqs", "32",
           "--uvicorn-log-level", "warning", *args]
    if api_key:
        cmd += ["--api-key", api_key]
    log = open(log_path, "wb")
    # new_session: the server and its children are a process group of their own, which a
    # test may signal as a whole (as systemd stops a service).
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=new_session)
    server = Server(proc, port, log_path, api_key, scheme=scheme)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}:\n{server.log()[-5000:]}")
        try:
            if httpx.get(server.url + "/health", timeout=2, verify=False).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.stop()
    raise AssertionError(f"server did not become healthy in {timeout} s:\n{server.log()[-5000:]}")


def wait_until(predicate, timeout: float = 30, interval: float = 0.2):
    """Poll ``predicate`` until it returns something truthy; that value, or the last one."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


async def until(condition, timeout: float = 30) -> None:
    """``wait_until`` for a test's event loop: poll ``condition`` (which must hold within
    ``timeout``) without blocking the engine's tasks."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def kill_during_stream(srv: Server, pid: int, stream, processes: list[int], fails_within: float | None = None,
                       gone_within: float = 20) -> None:
    """SIGKILL ``pid`` (a worker) while ``stream`` (a streamed completion, started) runs:
    the stream fails (within ``fails_within`` seconds, when given) with an error saying a
    process died, the server exits non-zero, and none of ``processes`` is left after
    ``gone_within`` seconds."""
    import openai

    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(openai.APIError) as caught:
        for _ in stream:
            pass
    if fails_within is not None:
        assert time.monotonic() - killed < fails_within
    assert "died" in str(caught.value) or "dead" in str(caught.value), caught.value
    assert srv.proc.wait(60) != 0  # the server notices and shuts itself down
    assert wait_until(lambda: not any(alive(p) for p in processes), gone_within), \
        [p for p in processes if alive(p)]


def stop_and_check(srv: Server, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
    """Send ``sig`` to the API server; its exit status, after checking no process is left."""
    pids = descendants(srv.proc.pid)
    if srv.proc.poll() is None:
        srv.proc.send_signal(sig)
    try:
        rc = srv.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        raise AssertionError(f"server did not stop within {timeout} s after {signal.Signals(sig).name}\n"
                             f"{srv.log()[-3000:]}")
    wait_until(lambda: not any(alive(p) for p in pids), 10)
    left = [p for p in pids if alive(p)]
    assert not left, f"orphan processes left after shutdown: {[cmdline(p) for p in left]}"
    return rc


@pytest.fixture(scope="session")
def server(tiny_llama: Path, plugin_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One shared server on the tiny Llama (tests must leave it healthy).

    Every example plugin is installed and none is enabled (``FORKLESS_PLUGINS=""``), as
    on a machine where plugins are present but not wanted.
    """
    tmp = tmp_path_factory.mktemp("server")
    srv = start_server(tiny_llama, tmp, "--served-model-name", "tiny", site=plugin_site)
    yield srv
    assert stop_and_check(srv) == 0, srv.log()[-3000:]
