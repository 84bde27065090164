"""A platform plugin alone runs the whole server: its platform, its attention backend."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.server.conftest import start_server


def test_example_platform_runs_the_server_with_its_own_backend(
    tiny_llama: Path, plugin_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORKLESS_PLUGINS_FOR_TESTS", "example_cpu")
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", site=plugin_site,
                       env_extra={"FORKLESS_EXAMPLE_PLATFORM": "1"})
    try:
        resp = httpx.post(srv.url + "/v1/completions", timeout=60,
                          json={"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 4
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]
    log = srv.log()
    # The worker logs which platform and backend it runs; the backend logs that it ran.
    assert ("platform example_cpu (example CPU device), attention backend example_cpu "
            "(forkless_example_platform.attention:ExampleAttentionBackend)") in log, log[-3000:]
    assert "example_cpu attention backend: first forward pass" in log, log[-3000:]
    # Its own silu_and_mul custom op replaced forkless's in the worker.
    assert "example_cpu silu_and_mul: first call" in log, log[-3000:]
