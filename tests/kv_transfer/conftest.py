"""Fixtures of the KV connector tests: a real ``redis-server`` on a free loopback port."""

from __future__ import annotations

import shutil
import subprocess
from typing import Iterator

import pytest

from tests.server.conftest import free_port, wait_until


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen]]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: `make test` installs it (Debian package redis-server)")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=tmp_path_factory.mktemp("redis"))
    import redis

    client = redis.Redis(port=port)
    assert wait_until(lambda: _pings(client), 10), "redis-server did not start"
    yield f"redis://127.0.0.1:{port}", proc
    proc.terminate()
    proc.wait(10)


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001 - not up yet
        return False


