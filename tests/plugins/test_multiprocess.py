"""Three spawned processes each load the plugins; only the worker imports the model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, plugin_env


def run_three(site: Path, tmp_path: Path, **env: str) -> dict:
    record_dir = tmp_path / "records"
    record_dir.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("_three_processes.py"))],
        env=plugin_env(site, tmp_path, FORKLESS_EXAMPLE_RECORD_DIR=str(record_dir), **env),
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_process_loads_plugins_and_only_the_worker_imports_the_model(plugin_site: Path, tmp_path: Path) -> None:
    reports = run_three(plugin_site, tmp_path, FORKLESS_PLUGINS="example_model")
    arch = reports["worker"]["registries"]["model architecture"]
    for role in ("api-server", "engine-core", "worker"):
        assert reports[role]["registries"]["model architecture"] == arch  # all see the same
        assert arch["ToyLlamaForCausalLM"] == "forkless_example_model.model:ToyLlamaForCausalLM"
    assert reports["worker"]["resolved"] == "forkless_example_model.model:ToyLlamaForCausalLM"
    assert reports["worker"]["model_module_imported"]
    assert not reports["api-server"]["model_module_imported"]
    assert not reports["engine-core"]["model_module_imported"]
    assert not reports["api-server"]["torch_imported"]
    # each spawned process ran the plugin itself, exactly once despite two calls
    events = [json.loads(line) for f in (tmp_path / "records").iterdir() for line in f.read_text().splitlines()]
    registered = sorted(e["process"] for e in events if e["event"] == "registered")
    assert registered == ["forkless-api-server", "forkless-engine-core", "forkless-worker"]
    imported = [e["process"] for e in events if e["event"] == "model module imported"]
    assert imported == ["forkless-worker"]


def test_filtered_out_architecture_is_unknown_everywhere(plugin_site: Path, tmp_path: Path) -> None:
    reports = run_three(plugin_site, tmp_path, FORKLESS_PLUGINS="nonreentrant")
    for role in ("api-server", "engine-core", "worker"):
        assert "ToyLlamaForCausalLM" not in reports[role]["registries"]["model architecture"]
    error = reports["worker"]["error"]
    assert error.startswith("UnsupportedArchitectureError: Model architectures ['ToyLlamaForCausalLM'] are not "
                            "supported for now")
    assert "LlamaForCausalLM" in error and "NonReentrantForCausalLM" in error  # lists what is available
