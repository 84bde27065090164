"""Lifecycle: a killed process leaves no ``forkless-*`` IPC directory behind.

The API server makes the server's IPC directory in ``$TMPDIR``; whichever process
survives a SIGKILL removes it (the API server after its engine core died, the engine
core or the worker after their parent died). A worker killed mid-request is covered in
``tests/server/test_faults.py``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.server.conftest import alive, descendants, start_server, wait_until


@pytest.mark.parametrize("victim", ["api_server", "engine_core"])
def test_a_killed_process_leaves_no_ipc_directory(tiny_llama: Path, tmp_path: Path, victim: str) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    srv = start_server(tiny_llama, tmp_path, env_extra={"TMPDIR": str(tmpdir)})
    processes = descendants(srv.proc.pid)
    try:
        assert [name for name in os.listdir(tmpdir) if name.startswith("forkless-")]  # made in TMPDIR
        engine_core, _ = srv.engine_pids()
        os.kill(srv.proc.pid if victim == "api_server" else engine_core, signal.SIGKILL)
        rc = srv.proc.wait(60)
        assert rc == -signal.SIGKILL if victim == "api_server" else rc != 0
        assert wait_until(lambda: not any(alive(p) for p in processes), 30), \
            f"processes left: {[p for p in processes if alive(p)]}"
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    assert wait_until(lambda: not os.listdir(tmpdir), 10), f"left in TMPDIR: {os.listdir(tmpdir)}"
    assert "Traceback" not in srv.log(), srv.log()[-3000:]
