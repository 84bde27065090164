"""``forkless plugins list | check | bisect`` as a user runs them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import plugin_env, run_forkless


def test_list_json_shows_every_group_and_status(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_forkless(["plugins", "list", "--json"], plugin_env(plugin_site, tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["example_model"] == {
        **rows["example_model"],
        "group": "forkless.general_plugins", "value": "forkless_example_model:register",
        "dist": "forkless-example-model", "version": "0.1.0", "status": "loaded", "error": None,
    }
    assert rows["example_model"]["load_ms"] > 0
    assert rows["example_hello"]["status"] == "opt-in"
    assert rows["example_cpu"]["group"] == "forkless.platform_plugins"
    assert rows["broken_call"]["status"] == "failed" and "fails on purpose" in rows["broken_call"]["error"]
    assert rows["incompatible"]["status"] == "incompatible"
    proc = run_forkless(["plugins", "list", "--json"], plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="example_hello"))
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["example_hello"]["status"] == "loaded" and rows["example_model"]["status"] == "filtered"


def test_list_table(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_forkless(["plugins", "list"], plugin_env(plugin_site, tmp_path))
    assert proc.returncode == 0
    header, *lines = proc.stdout.splitlines()
    assert header.split()[:5] == ["group", "name", "value", "distribution", "status"]
    assert any("example_model" in ln and "loaded" in ln for ln in lines)


def test_check_flags_non_reentrant_and_broken(plugin_site: Path, tmp_path: Path) -> None:
    env = plugin_env(plugin_site, tmp_path)
    proc = run_forkless(["plugins", "check", "--json"], env)
    assert proc.returncode == 1
    results = {r["name"]: r for r in json.loads(proc.stdout)}
    good = results["example_model"]
    assert good["ok"] and good["problems"] == []
    assert "forkless_example_model" in good["imported_modules"] and good["heavy_imports"] == []
    assert good["registry_changes_on_second_call"] == {}
    assert good["load_ms"] > 0
    bad = results["nonreentrant"]
    assert not bad["ok"]
    assert "NonReentrantForCausalLM" in bad["registry_changes_on_second_call"]["model architecture"]
    assert any(p.startswith("not re-entrant") for p in bad["problems"])
    assert not results["broken_call"]["ok"] and not results["incompatible"]["ok"]
    assert results["example_cpu"]["ok"] and results["example_hello"]["ok"]


def test_check_named_plugins_and_exit_status(plugin_site: Path, tmp_path: Path) -> None:
    env = plugin_env(plugin_site, tmp_path)
    proc = run_forkless(["plugins", "check", "example_model", "example_cpu"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok   example_model")
    proc = run_forkless(["plugins", "check", "nonreentrant"], env)
    assert proc.returncode == 1 and "problem: not re-entrant" in proc.stdout
    proc = run_forkless(["plugins", "check", "no_such_plugin"], env)
    assert proc.returncode == 2 and "no installed plugin named no_such_plugin; installed: " in proc.stderr


def test_check_flags_eager_heavy_imports(tmp_path: Path) -> None:
    """A general plugin that imports torch while registering fails the laziness check."""
    site = tmp_path / "site"
    (site / "eager_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "eager_plugin.py").write_text(
        "def register():\n    import torch\n    from forkless import ModelRegistry\n"
        "    ModelRegistry.register_model('EagerForCausalLM', 'eager_plugin:register')\n")
    (site / "eager_plugin-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: eager-plugin\nVersion: 1.0\n\n")
    (site / "eager_plugin-1.0.dist-info" / "entry_points.txt").write_text("[forkless.general_plugins]\neager = eager_plugin:register\n")
    proc = run_forkless(["plugins", "check", "--json"], plugin_env(site, tmp_path))
    assert proc.returncode == 1
    (result,) = json.loads(proc.stdout)
    assert result["heavy_imports"] == ["torch"]
    assert "not lazy: registration imported torch" in result["problems"][0]


def test_bisect_finds_the_plugin_that_breaks_a_command(plugin_site: Path, tmp_path: Path) -> None:
    # The command fails when a plugin fails to load under strict mode.
    cmd = [sys.executable, "-c", "from forkless.plugins import load_general_plugins; load_general_plugins()"]
    env = plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS_STRICT="1",
                     FORKLESS_PLUGINS="example_model,nonreentrant,broken_call,incompatible")
    proc = run_forkless(["plugins", "bisect", "--", *cmd], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "culprit: broken_call (the command fails when it is loaded, on its own)" in proc.stdout
    # a command that never fails: nothing to bisect
    proc = run_forkless(["plugins", "bisect", "--", sys.executable, "-c", "pass"], env)
    assert proc.returncode == 1 and "nothing to bisect" in proc.stdout
