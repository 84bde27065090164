"""Real plugin packages, pip-installed, in a running server: model, stat logger, endpoint,
logits processor. One server has them all enabled through ``FORKLESS_PLUGINS``."""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.server.conftest import Server, start_server, stop_and_check, wait_until

ENABLED = "example_model,example_stat_logger,example_force_token,example_hello"


@pytest.fixture(scope="module")
def toy_model(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama under the architecture name the example model plugin registers."""
    folder = tmp_path_factory.mktemp("toy") / "toy-llama"
    shutil.copytree(tiny_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["ToyLlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def plugin_server(toy_model: Path, plugin_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("plugin-server")
    (tmp / "records").mkdir()
    srv = start_server(toy_model, tmp, "--served-model-name", "toy", site=plugin_site, env_extra={
        "FORKLESS_PLUGINS": ENABLED,
        "FORKLESS_EXAMPLE_RECORD_DIR": str(tmp / "records"),
        "FORKLESS_EXAMPLE_STATS_FILE": str(tmp / "stats.jsonl"),
    })
    srv.extra.update(records=tmp / "records", stats=tmp / "stats.jsonl")
    yield srv
    assert stop_and_check(srv) == 0, srv.log()[-3000:]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_every_process_registers_and_only_the_worker_imports_the_model(plugin_server: Server) -> None:
    r = plugin_server.client().completions.create(model="toy", prompt="Toy models", max_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4
    core, worker = plugin_server.engine_pids()
    events = [e for f in sorted(plugin_server.extra["records"].glob("*.jsonl")) for e in read_jsonl(f)]
    registered = sorted((e["pid"], e["process"]) for e in events if e["event"] == "registered")
    assert registered == sorted([(plugin_server.proc.pid, "MainProcess"), (core, "forkless-engine-core"),
                                 (worker, "forkless-worker-0")])
    imported = [(e["pid"], e["process"]) for e in events if e["event"] == "model module imported"]
    assert imported == [(worker, "forkless-worker-0")]


def stat_totals(path: Path) -> dict:
    records = [e for e in read_jsonl(path) if e["event"] == "record"]
    return {"prompt": sum(e["prompt_tokens"] for e in records),
            "generation": sum(e["generation_tokens"] for e in records),
            "finished": sorted(reason for e in records for reason in e["finished"])}


def test_stat_logger_plugin_receives_the_requests(plugin_server: Server) -> None:
    path = plugin_server.extra["stats"]
    assert [e["event"] for e in read_jsonl(path)].count("engine_initialized") == 1
    before = stat_totals(path)
    client = plugin_server.client()
    sent = [client.completions.create(model="toy", prompt=f"Count {i}", max_tokens=3 + i, temperature=0)
            for i in range(3)]
    expected = {"prompt": before["prompt"] + sum(r.usage.prompt_tokens for r in sent),
                "generation": before["generation"] + sum(r.usage.completion_tokens for r in sent),
                "finished": sorted(before["finished"] + ["length"] * 3)}
    assert wait_until(lambda: stat_totals(path) == expected, 10), (stat_totals(path), expected)


def test_stat_logger_plugin_keeps_stats_on_under_disable_log_stats(toy_model: Path, plugin_site: Path,
                                                                   tmp_path: Path) -> None:
    """As vLLM: with --disable-log-stats a stat logger plugin still gets every batch, and
    the Prometheus series at /metrics are kept with it; only the periodic line is off."""
    from tests.server.test_metrics import THROUGHPUT_LINE, scrape, value

    stats = tmp_path / "stats.jsonl"
    srv = start_server(toy_model, tmp_path, "--served-model-name", "toy", "--disable-log-stats", site=plugin_site,
                       env_extra={"FORKLESS_PLUGINS": "example_model,example_stat_logger",
                                  "FORKLESS_EXAMPLE_STATS_FILE": str(stats), "FORKLESS_LOG_STATS_INTERVAL": "0.3"})
    try:
        sent = [srv.client().completions.create(model="toy", prompt=f"Count {i}", max_tokens=3, temperature=0)
                for i in range(2)]
        generated = sum(r.usage.completion_tokens for r in sent)
        assert wait_until(lambda: stat_totals(stats)["generation"] == generated, 10), stat_totals(stats)
        assert wait_until(lambda: value(scrape(srv), "forkless:generation_tokens_total") == generated, 10)
        time.sleep(1.0)  # three log intervals
        assert THROUGHPUT_LINE not in srv.log()
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]


def test_prometheus_stat_logger_plugin_replaces_the_default(tiny_llama: Path, plugin_site: Path,
                                                            tmp_path: Path) -> None:
    """As vLLM: a plugin subclassing PrometheusStatLogger is the Prometheus logger /metrics
    renders (its own series and the default ones, counted once), not one beside it."""
    from tests.server.test_metrics import scrape, value

    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", site=plugin_site,
                       env_extra={"FORKLESS_PLUGINS": "example_prometheus_stat_logger"})
    try:
        sent = [srv.client().completions.create(model="tiny", prompt=f"Count {i}", max_tokens=3, temperature=0)
                for i in range(2)]
        assert wait_until(lambda: value(scrape(srv), "forkless:request_success_total") == 2, 10), srv.log()[-3000:]
        m = scrape(srv)
        assert value(m, "forkless:generation_tokens_total") == sum(r.usage.completion_tokens for r in sent)
        assert value(m, "forkless:example_output_batches_total") > 0
        assert "replaces the default Prometheus stat logger" in srv.log()
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]


def test_opted_in_endpoint_plugin_serves_its_route(plugin_server: Server) -> None:
    resp = httpx.get(plugin_server.url + "/example/hello", timeout=30)
    assert resp.status_code == 200
    assert resp.json() == {"hello": "from forkless-example-endpoint"}


def forced_token(server: Server, word: str = " cat") -> tuple[int, str]:
    """A token id and the text of that token repeated four times."""
    token = httpx.post(server.url + "/tokenize", json={"prompt": word, "add_special_tokens": False},
                       headers=auth(server)).json()["tokens"][0]
    text = httpx.post(server.url + "/detokenize", json={"tokens": [token] * 4}, headers=auth(server)).json()["prompt"]
    return token, text


def auth(server: Server) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}


def check_force_token_processor(server: Server, model: str) -> None:
    """Only the requests that pass ``force_token_id`` are forced, whichever field carries it."""
    client = server.client()
    token, forced_text = forced_token(server)
    kw = dict(model=model, prompt="The weather today", max_tokens=4, temperature=0)
    plain = client.completions.create(**kw).choices[0].text
    assert plain != forced_text
    via_xargs = client.completions.create(**kw, extra_body={"vllm_xargs": {"force_token_id": token}})
    assert via_xargs.choices[0].text == forced_text
    via_extra_args = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
        extra_body={"extra_args": {"force_token_id": token}})
    assert via_extra_args.choices[0].message.content == forced_text
    # in the same batch as a forced request, a plain one is untouched
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(
            lambda xargs: client.completions.create(**kw, extra_body=xargs).choices[0].text,
            [{"vllm_xargs": {"force_token_id": token}}, None] * 2))
    assert texts == [forced_text, plain] * 2
    resp = httpx.post(server.url + "/v1/completions", headers=auth(server),
                      json={**kw, "vllm_xargs": {"force_token_id": -3}}, timeout=30)
    assert resp.status_code == 400 and "force_token_id" in resp.json()["error"]["message"]


def test_logits_processor_entry_point_affects_only_requests_that_ask(plugin_server: Server) -> None:
    check_force_token_processor(plugin_server, "toy")


def test_unlisted_endpoint_plugin_is_404_with_one_hint(server: Server) -> None:
    assert httpx.get(server.url + "/example/hello", timeout=30).status_code == 404
    hints = [line for line in server.log().splitlines() if "'example_hello'" in line]
    assert len(hints) == 1, hints
    # FORKLESS_PLUGINS="" (none) is set, so the hint adds the plugin to that empty list.
    assert "enable it with FORKLESS_PLUGINS=example_hello" in hints[0]


def test_an_endpoint_plugin_whose_attach_router_raises_is_named(tiny_llama: Path, tmp_path: Path) -> None:
    """The server cannot build its app; the error names the plugin and its distribution,
    not only the exception's text."""
    from tests.plugins.test_cli import fake_plugin

    site = tmp_path / "site"
    fake_plugin(site, "boom_endpoint", "class R:\n    def attach_router(self, app):\n"
                "        raise RuntimeError('no route table')\n\ndef make():\n    return R()\n",
                group="forkless.endpoint_plugins", value="make")
    with pytest.raises(AssertionError, match="server exited with 2") as info:
        start_server(tiny_llama, tmp_path, site=site, env_extra={"FORKLESS_PLUGINS": "+boom_endpoint"})
    assert ("could not build the HTTP app: endpoint plugin 'boom_endpoint' (distribution boom-endpoint 1.0): "
            "attach_router(app) raised RuntimeError: no route table") in str(info.value)


def test_an_endpoint_plugin_that_fails_stops_the_server_and_a_shadowed_route_is_said(tiny_llama: Path,
                                                                                       tmp_path: Path) -> None:
    """Opted in by name, an endpoint plugin whose factory raises stops the server naming it
    (it was skipped with a warning, while one whose attach_router raised stopped it); a route
    that forkless answers first is said to be never served (it was attached in silence)."""
    from tests.plugins.test_cli import fake_plugin

    site = tmp_path / "site"
    fake_plugin(site, "boom_factory", "def make():\n    raise RuntimeError('no config')\n",
                group="forkless.endpoint_plugins", value="make")
    fake_plugin(site, "shadow_health", (
        "class R:\n    def attach_router(self, app):\n"
        "        @app.get('/health')\n        async def mine():\n            return {'mine': True}\n"
        "        @app.get('/shadow/ok')\n        async def ok():\n            return {'ok': True}\n\n"
        "def make():\n    return R()\n"), group="forkless.endpoint_plugins", value="make")
    with pytest.raises(AssertionError, match="server exited with 2") as info:
        start_server(tiny_llama, tmp_path, site=site, env_extra={"FORKLESS_PLUGINS": "+boom_factory"})
    assert "endpoint plugin 'boom_factory' (distribution boom-factory 1.0) failed: " in str(info.value)
    assert "no config" in str(info.value)
    srv = start_server(tiny_llama, tmp_path, site=site, env_extra={"FORKLESS_PLUGINS": "+shadow_health"})
    try:
        assert httpx.get(srv.url + "/shadow/ok", timeout=30).json() == {"ok": True}
        assert httpx.get(srv.url + "/health", timeout=30).status_code == 200  # forkless's, not the plugin's
        assert ("endpoint plugin 'shadow_health' (distribution shadow-health 1.0): its route(s) GET /health are "
                "never served") in srv.log()
    finally:
        srv.stop()
