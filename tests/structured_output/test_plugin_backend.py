"""A structured-output backend registered by a general plugin (a real package with a real
entry point, installed for this test), selected with ``--structured-outputs-config``;
an unknown backend stops the server at start, listing the available ones."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import install_packages, plugin_env
from tests.server.conftest import start_server, stop_and_check

PLUGIN = Path(__file__).parent / "trie_plugin"


@pytest.fixture(scope="module")
def trie_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("trie-site")
    install_packages(site, [PLUGIN])
    return site


def test_a_plugin_backend_serves_its_constraints_and_refuses_others(tiny_llama: Path, trie_site: Path,
                                                                    tmp_path: Path) -> None:
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny",
                       "--structured-outputs-config", json.dumps({"backend": "choice_trie"}), site=trie_site,
                       env_extra={"FORKLESS_PLUGINS": "so_trie"})
    try:
        client = srv.client()
        choices = ["alpha beta", "gamma", "delta epsilon zeta"]
        for temperature in (0.0, 1.0):
            reply = client.completions.create(model="tiny", prompt="Pick one:", max_tokens=20,
                                              temperature=temperature, extra_body={"structured_outputs":
                                                                                   {"choice": choices}})
            assert reply.choices[0].text in choices and reply.choices[0].finish_reason == "stop"
        with pytest.raises(openai.BadRequestError, match="choice_trie backend compiles only choice"):
            client.completions.create(model="tiny", prompt="x", max_tokens=5,
                                      extra_body={"structured_outputs": {"regex": "[a-z]+"}})
        # A check that takes 1.5 s runs off the API server's event loop: /health answers meanwhile.
        slow_choices = ["slow to check", "gamma"]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            slow = pool.submit(client.completions.create, model="tiny", prompt="Pick one:", max_tokens=20,
                               extra_body={"structured_outputs": {"choice": slow_choices}})
            waits = []
            while not slow.done():
                start = time.perf_counter()
                assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
                waits.append(time.perf_counter() - start)
                time.sleep(0.05)
            assert slow.result().choices[0].text in slow_choices
        assert len(waits) >= 10 and max(waits) < 0.75, waits
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]


def test_an_unknown_backend_stops_the_server_listing_the_available_ones(tiny_llama: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", str(tiny_llama), "--port", "0",
         "--structured-outputs-config", '{"backend": "outlines"}'],
        env=plugin_env(None, tmp_path, FORKLESS_PLUGINS=""), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "unknown structured-output backend 'outlines'; available: auto, guidance, xgrammar" in proc.stderr
