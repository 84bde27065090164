"""Lifecycle: ``forkless serve`` on a busy port fails at once, before any model loads.

(``test_lifecycle_shutdown.py`` also starts a second server on a running one's port and
compares the two times.)
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import plugin_env


def test_a_busy_port_fails_before_the_engine_starts(tiny_llama: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", str(tiny_llama),
                              "--port", str(port)], env=plugin_env(None, tmp_path, FORKLESS_PLUGINS=""),
                             capture_output=True, text=True, timeout=120)
        elapsed = time.monotonic() - start
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert f"forkless serve: error: port {port} on 127.0.0.1 is already in use" in output, output
    # Nothing was started or loaded: the port is the first thing taken.
    assert "engine core" not in output and "tokenizer" not in output and "serve: ready in" not in output, output
    assert elapsed < 15, f"{elapsed:.1f} s"  # the imports of the command line only (a start takes 20 s and more)


def test_served_connections_send_small_writes_at_once() -> None:
    # Nagle's algorithm off (TCP_NODELAY) on accepted connections, as asyncio sets it for
    # TCP sockets: with it on, every answer after the first on a kept-alive connection, and
    # each SSE chunk, waited ~40 ms for the client's delayed ACK.
    import asyncio

    from forkless.entrypoints.cli.serve import bind_listener

    async def accepted_nodelay() -> int:
        listener = bind_listener("127.0.0.1", 0)
        port = listener.getsockname()[1]
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            value = await asyncio.wait_for(seen, 10)
            writer.close()
        return value

    assert asyncio.run(accepted_nodelay()) != 0


def test_a_model_path_that_does_not_exist_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", str(tmp_path / "no-model"),
                          "--port", "0"], env=plugin_env(None, tmp_path, FORKLESS_PLUGINS=""),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert f"forkless serve: error: model '{tmp_path / 'no-model'}' is not a local folder or file" in run.stderr
    assert "Traceback" not in run.stderr
