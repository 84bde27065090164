"""IO processors written for vLLM serve /pooling by renaming their imports: vLLM's current
interface (``parse_data``, ``merge_pooling_params``, ``(vllm_config, renderer)``) and its
earlier one (``parse_request``, ``validate_or_generate_params``, an ``output_to_response``
that makes the whole ``IOProcessorResponse``, answered as it is, not wrapped again)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import install_packages
from tests.pooling.conftest import minilm_folder
from tests.server.conftest import start_server

PACKAGE = Path(__file__).resolve().parent / "vllm_style_io_processor"
TEXTS = ["Simmer the sauce.", "The striker scored twice."]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("vllm-style-io-site")
    install_packages(target, [PACKAGE])
    return target


@pytest.mark.parametrize("name", ["echo_current", "echo_earlier"])
def test_either_interface_answers_pooling(site: Path, tmp_path: Path, name: str) -> None:
    srv = start_server(minilm_folder(), tmp_path, "--io-processor-plugin", name, "--max-model-len", "128", site=site,
                       env_extra={"FORKLESS_PLUGINS": name})
    try:
        r = httpx.post(srv.url + "/pooling", json={"data": TEXTS, "request_id": "mine"}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        style = name.split("_")[1]
        assert body["data"]["style"] == style and set(body) == {"request_id", "created_at", "data"}
        assert [t["dims"] for t in body["data"]["texts"]] == [384, 384]
        assert body["request_id"] == ("mine" if style == "current" else "made-by-the-plugin")
        assert isinstance(body["created_at"], int) and body["created_at"] > 0
        if style == "current":  # the plugin's ValueError is the client's 400
            bad = httpx.post(srv.url + "/pooling", json={"data": "not a list"}, timeout=60)
            assert bad.status_code == 400 and "list of texts" in bad.json()["error"]["message"]
    finally:
        srv.stop()


def test_a_processor_that_parses_nothing_is_refused_at_start(site: Path, tmp_path: Path) -> None:
    from tests.conftest import plugin_env, run_forkless

    env = plugin_env(site, tmp_path, FORKLESS_PLUGINS="echo_unparsing")
    proc = run_forkless(["serve", str(minilm_folder()), "--port", "0", "--io-processor-plugin", "echo_unparsing"],
                        env, timeout=120)
    assert proc.returncode == 2
    assert "implements neither parse_data(data) nor vLLM's earlier parse_request(request)" in proc.stderr


def test_the_models_config_names_the_processor(site: Path, tmp_path: Path) -> None:
    """vLLM's rule: without --io-processor-plugin, the model's config.json may name one."""
    import json
    import shutil

    model = tmp_path / "minilm-with-plugin"
    shutil.copytree(minilm_folder(), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "io_processor_plugin": "echo_current"}))
    srv = start_server(model, tmp_path, "--max-model-len", "128", site=site,
                       env_extra={"FORKLESS_PLUGINS": "echo_current"})
    try:
        r = httpx.post(srv.url + "/pooling", json={"data": TEXTS, "task": "plugin"}, timeout=60)  # vLLM's task
        assert r.status_code == 200 and r.json()["data"]["style"] == "current", r.text
        other = httpx.post(srv.url + "/pooling", json={"data": TEXTS, "task": "embed"}, timeout=60)
        assert other.status_code == 400 and other.json()["error"]["param"] == "task", other.text
        assert "config.json names io_processor_plugin 'echo_current'" in srv.log()
    finally:
        srv.stop()
