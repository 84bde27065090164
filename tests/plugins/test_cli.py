"""``forkless plugins list | check | bisect`` as a user runs them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

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
    assert rows["example_cpu"]["status"] == "inactive"  # its detector returned None
    assert rows["broken_call"]["status"] == "failed" and "fails on purpose" in rows["broken_call"]["error"]
    assert rows["incompatible"]["status"] == "incompatible"
    proc = run_forkless(["plugins", "list", "--json"], plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="example_hello"))
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["example_hello"]["status"] == "loaded" and rows["example_model"]["status"] == "filtered"
    proc = run_forkless(["plugins", "list", "--json"], plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="+example_hello"))
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["example_hello"]["status"] == "loaded" and rows["example_model"]["status"] == "loaded"
    proc = run_forkless(["plugins", "list", "--json"], plugin_env(plugin_site, tmp_path, FORKLESS_EXAMPLE_PLATFORM="1"))
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["example_cpu"]["status"] == "loaded" and rows["example_cpu_twin"]["status"] == "inactive"


def test_list_under_strict_mode_reports_every_failure_and_each_traceback_once(
        plugin_site: Path, tmp_path: Path) -> None:
    env = plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS_STRICT="1")
    proc = run_forkless(["plugins", "list", "--json"], env)
    assert proc.returncode == 1
    rows = {r["name"]: r for r in json.loads(proc.stdout)}  # the table still comes out
    assert rows["example_model"]["status"] == "loaded" and rows["broken_detector"]["status"] == "failed"
    err = proc.stderr
    error = err[err.index("forkless plugins list: error: "):]
    assert error.startswith("forkless plugins list: error: 4 plugin(s) failed and "
                            "FORKLESS_PLUGINS_STRICT=1 aborts startup")
    for name in ("broken_call", "broken_detector", "broken_import", "incompatible"):
        assert f"  - '{name}' (group " in error
    assert "Traceback" not in error
    assert err.count('raise RuntimeError("forkless-example-broken: this plugin fails on purpose")') == 1
    assert err.count('raise RuntimeError("forkless-example-broken: this detector fails on purpose")') == 1
    assert err.count("in _find_and_load_unlocked") == 1  # broken_import's traceback
    assert err.count("Traceback (most recent call last)") == 4  # broken_import's is chained: two


def test_list_table(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_forkless(["plugins", "list"], plugin_env(plugin_site, tmp_path))
    assert proc.returncode == 0
    header, *lines = proc.stdout.splitlines()
    assert header.split()[:5] == ["group", "name", "value", "distribution", "status"]
    assert any("example_model" in ln and "loaded" in ln for ln in lines)


def test_serve_under_strict_mode_prints_each_traceback_once(plugin_site: Path, tmp_path: Path) -> None:
    """serve loads the general plugins before anything else: it stops there, naming all."""
    proc = run_forkless(["serve", str(tmp_path / "no-model")],
                        plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS_STRICT="1"))
    assert proc.returncode != 0
    err = proc.stderr
    # raised, or caught and printed by serve: either way one message, naming all three
    assert err.count("3 plugin(s) failed and FORKLESS_PLUGINS_STRICT=1 aborts startup") == 1
    for name in ("broken_call", "broken_import", "incompatible"):
        assert f"  - '{name}' (group forkless.general_plugins" in err
    assert err.count('raise RuntimeError("forkless-example-broken: this plugin fails on purpose")') == 1
    assert err.count("in _find_and_load_unlocked") == 1
    assert "During handling of the above exception" not in err


def test_check_flags_non_reentrant_and_broken(plugin_site: Path, tmp_path: Path) -> None:
    env = plugin_env(plugin_site, tmp_path)
    proc = run_forkless(["plugins", "check", "--json"], env)
    assert proc.returncode == 1
    results = {r["name"]: r for r in json.loads(proc.stdout)}
    good = results["example_model"]
    assert good["ok"] and good["problems"] == []
    # only top-level packages that registration imported for the first time: not forkless
    assert good["imported_modules"] == ["forkless_example_model"] and good["heavy_imports"] == []
    assert good["registered"] == {
        "model architecture": {"ToyLlamaForCausalLM": "forkless_example_model.model:ToyLlamaForCausalLM"}}
    assert good["registry_changes_on_second_call"] == {}
    assert good["load_ms"] > 0
    bad = results["nonreentrant"]
    assert not bad["ok"]
    assert "NonReentrantForCausalLM" in bad["registry_changes_on_second_call"]["model architecture"]
    assert any(p.startswith("not re-entrant") for p in bad["problems"])
    assert not results["broken_call"]["ok"] and not results["incompatible"]["ok"]
    assert results["example_cpu"]["ok"] and results["example_hello"]["ok"]
    assert results["example_cpu"]["inactive"] is True  # FORKLESS_EXAMPLE_PLATFORM is unset
    assert "inactive" not in results["example_model"]  # only detector groups have the notion
    assert results["example_tool_parser"]["ok"]  # its registered parser imports and subclasses ToolParser


def test_check_reports_an_inactive_detector(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_forkless(["plugins", "check", "example_cpu"], plugin_env(plugin_site, tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("ok   example_cpu (forkless.platform_plugins, forkless-example-platform) load ")
    assert lines[1] == ("     inactive: it returned None (its device or feature is absent here), so "
                        "forkless does not use it on this machine")
    proc = run_forkless(["plugins", "check", "--json", "example_cpu"],
                        plugin_env(plugin_site, tmp_path, FORKLESS_EXAMPLE_PLATFORM="1"))
    (result,) = _site_plugins(json.loads(proc.stdout))
    assert result["ok"] and result["inactive"] is False


def fake_plugin(site: Path, module: str, source: str, group: str = "forkless.general_plugins",
                value: str = "register", **modules: str) -> None:
    """Install a one-module plugin distribution (and extra modules) into ``site`` by hand."""
    info = site / f"{module}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{module} = {module}:{value}\n")
    (site / f"{module}.py").write_text(source)
    for name, body in modules.items():
        (site / f"{name}.py").write_text(body)


def _site_plugins(results: list[dict]) -> list[dict]:
    """``plugins check --json`` results without forkless's own plugins (its LoRA resolver)."""
    return [r for r in results if r.get("dist") != "forkless"]


def test_check_imports_every_registered_class_path(tmp_path: Path) -> None:
    """A typo in a registered path fails check, not the first model load."""
    site = tmp_path / "site"
    fake_plugin(site, "typo_plugin", (
        "def register():\n"
        "    from forkless import ModelRegistry\n"
        "    from forkless.tool_parsers import ToolParserManager\n"
        "    ModelRegistry.register_model('TypoForCausalLM', 'typo_plugin_model.modle:TypoModel')\n"
        "    ModelRegistry.register_model('GoodForCausalLM', 'typo_plugin_model:GoodModel')\n"
        "    ToolParserManager.register_lazy_module('not_a_parser', 'typo_plugin_model:GoodModel')\n"),
        typo_plugin_model="class GoodModel:\n    pass\n")
    proc = run_forkless(["plugins", "check", "--json"], plugin_env(site, tmp_path))
    assert proc.returncode == 1
    (result,) = _site_plugins(json.loads(proc.stdout))
    problems = [p for p in result["problems"] if p.startswith("registered ")]
    assert len(problems) == 2, result["problems"]
    assert problems[0].startswith("registered model architecture 'TypoForCausalLM' -> "
                                  "'typo_plugin_model.modle:TypoModel' is broken: PluginImportError: ")
    assert "No module named 'typo_plugin_model.modle'" in problems[0]
    assert problems[1].startswith("registered tool parser 'not_a_parser' -> 'typo_plugin_model:GoodModel' "
                                  "is broken: TypeError: ")
    assert "not a subclass of forkless.tool_parsers" in problems[1]
    # the registered module was imported after the laziness measurement, not during it
    assert result["imported_modules"] == ["typo_plugin"]
    assert set(result["registered"]["model architecture"]) == {"TypoForCausalLM", "GoodForCausalLM"}


def test_check_builds_every_registered_lora_resolver(tmp_path: Path) -> None:
    """LoRA resolvers live outside the lazy registries: a typo in one's path passed check
    and failed only when a request named an unknown model."""
    site = tmp_path / "site"
    fake_plugin(site, "resolver_plugin", (
        "def register():\n"
        "    from forkless.lora import LoRAResolverRegistry\n"
        "    from resolver_plugin_mod import Good\n"
        "    LoRAResolverRegistry.register_resolver('typo', 'resolver_plugin_mod:Resolvr')\n"
        "    LoRAResolverRegistry.register_resolver('good', Good())\n"),
        resolver_plugin_mod=("from forkless.lora import LoRAResolver\n"
                             "class Resolver(LoRAResolver):\n"
                             "    async def resolve_lora(self, base_model_name, lora_name):\n        return None\n"
                             "class Good(Resolver):\n    pass\n"))
    proc = run_forkless(["plugins", "check", "--json", "resolver_plugin"], plugin_env(site, tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)
    assert len(result["problems"]) == 1, result["problems"]
    assert result["problems"][0].startswith(
        "registered LoRA resolver 'typo' -> 'resolver_plugin_mod:Resolvr' is broken: PluginImportError: ")
    assert list(result["registered"]["LoRA resolver"]) == ["typo", "good"]


@pytest.mark.parametrize(("group", "returned", "fragment"), [
    ("forkless.platform_plugins", "typo_detector_mod.platfrom:MyPlatform", "No module named"),
    ("forkless.platform_plugins", "typo_detector_mod:NotAPlatform", "not a subclass of forkless.platforms:Platform"),
    ("forkless.io_processor_plugins", "typo_detector_mod:HalfProcessor", "does not implement the abstract method"),
])
def test_check_imports_the_class_path_a_detector_returns(tmp_path: Path, group: str, returned: str,
                                                         fragment: str) -> None:
    site = tmp_path / "site"
    fake_plugin(site, "typo_detector", f"def detect():\n    return {returned!r}\n", group=group, value="detect",
                typo_detector_mod=("from forkless.io_processors import IOProcessor\n"
                                   "class NotAPlatform:\n    pass\n"
                                   "class HalfProcessor(IOProcessor):\n"
                                   "    def pre_process(self, prompt, request_id=None, **kw):\n        return prompt\n"))
    proc = run_forkless(["plugins", "check", "--json", "typo_detector"], plugin_env(site, tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)
    assert any(p.startswith(f"returned {returned!r}") and fragment in p for p in result["problems"]), \
        result["problems"]


@pytest.mark.parametrize(("group", "source", "missing"), [
    ("forkless.logits_processors",
     "from forkless.logits_processors import LogitsProcessor\n"
     "class Half(LogitsProcessor):\n"
     "    def is_argmax_invariant(self):\n        return True\n"
     "    def update_state(self, batch_update):\n        pass\n", "apply"),
    ("forkless.stat_logger_plugins",
     "from forkless.metrics import StatLoggerBase\n"
     "class Half(StatLoggerBase):\n"
     "    def log(self):\n        pass\n", "log_engine_initialized, record"),
])
def test_check_flags_a_class_entry_point_with_abstract_methods_left(tmp_path: Path, group: str,
                                                                     source: str, missing: str) -> None:
    """A class entry point that cannot be instantiated fails check, not the server's start
    (a logits processor's only in the worker, after the model loaded)."""
    site = tmp_path / "site"
    fake_plugin(site, "half_class", source, group=group, value="Half")
    proc = run_forkless(["plugins", "check", "--json", "half_class"], plugin_env(site, tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)
    assert result["problems"] == [f"'half_class:Half': half_class.Half does not implement the abstract "
                                  f"method(s) {missing} of its interface"]


@pytest.mark.parametrize(("source", "problem"), [
    ("class R:\n    def attach_routes(self, app):\n        pass\n", "which has no attach_router(app)"),
    ("class R:\n    def attach_router(self, app):\n        raise RuntimeError('no route table')\n",
     "attach_router(app) raised RuntimeError: no route table"),
])
def test_check_attaches_an_endpoint_plugins_routes(tmp_path: Path, source: str, problem: str) -> None:
    """An endpoint plugin the API server would skip, or that stops it building its app,
    fails check (it used to pass as ok)."""
    site = tmp_path / "site"
    fake_plugin(site, "half_endpoint", source + "def make():\n    return R()\n",
                group="forkless.endpoint_plugins", value="make")
    proc = run_forkless(["plugins", "check", "--json", "half_endpoint"], plugin_env(site, tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)
    assert len(result["problems"]) == 1 and problem in result["problems"][0], result["problems"]


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
    (result,) = _site_plugins(json.loads(proc.stdout))
    assert result["heavy_imports"] == ["torch"]
    assert "not lazy: registration imported torch" in result["problems"][0]


def test_check_notes_torch_imported_by_a_logits_processor_without_failing(tmp_path: Path) -> None:
    """vLLM's examples import torch at module level, so this is no failure; but the API
    server imports the class too, and the list of imported modules hid torch past its
    first names."""
    site = tmp_path / "site"
    fake_plugin(site, "eager_processor", (
        "import torch\n"
        "from forkless.logits_processors import LogitsProcessor\n"
        "class Eager(LogitsProcessor):\n"
        "    def is_argmax_invariant(self):\n        return True\n"
        "    def update_state(self, batch_update):\n        pass\n"
        "    def apply(self, logits):\n        return logits\n"),
        group="forkless.logits_processors", value="Eager")
    proc = run_forkless(["plugins", "check", "eager_processor"], plugin_env(site, tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok   eager_processor (forkless.logits_processors")
    assert ("     note: loading it imported torch; the API server loads forkless.logits_processors "
            "plugins too and otherwise never imports torch: import it inside the methods that use it\n") in proc.stdout


def test_check_shortens_a_long_list_of_imported_modules(tmp_path: Path) -> None:
    site = tmp_path / "site"
    extra = {f"many_dep_{i:02d}": "" for i in range(11)}
    imports = "".join(f"    import {name}\n" for name in extra)
    fake_plugin(site, "many_plugin", f"def register():\n{imports}", **extra)
    proc = run_forkless(["plugins", "check", "--json"], plugin_env(site, tmp_path))
    (result,) = _site_plugins(json.loads(proc.stdout))
    assert result["imported_modules"] == sorted([*extra, "many_plugin"])  # JSON keeps them all
    proc = run_forkless(["plugins", "check"], plugin_env(site, tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = ", ".join(sorted(extra)[:8])
    assert f"     imported during registration: {shown} … and 4 more\n" in proc.stdout


def test_bisect_finds_the_plugin_that_breaks_a_command(plugin_site: Path, tmp_path: Path) -> None:
    # The command fails when a plugin fails to load under strict mode.
    cmd = [sys.executable, "-c", "from forkless.plugins import load_general_plugins; load_general_plugins()"]
    env = plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS_STRICT="1",
                     FORKLESS_PLUGINS="example_model,nonreentrant,broken_call")
    proc = run_forkless(["plugins", "bisect", "--", *cmd], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "culprit: broken_call (the command fails when it is loaded, on its own)" in proc.stdout
    assert "  without broken_call (2 plugin(s)): passes" in proc.stdout
    assert proc.stdout.endswith("run without it: FORKLESS_PLUGINS=example_model,nonreentrant\n")
    # a command that never fails: nothing to bisect
    proc = run_forkless(["plugins", "bisect", "--", sys.executable, "-c", "pass"], env)
    assert proc.returncode == 1 and "nothing to bisect" in proc.stdout


def test_bisect_finds_every_culprit(plugin_site: Path, tmp_path: Path) -> None:
    """docs/plugins.md §5: strict mode, every example installed, `forkless plugins list`.

    Four plugins fail there (an import, a call, a detector, a version), and the +name
    syntax adds the opt-in endpoint plugin to the candidates.
    """
    cmd = [sys.executable, "-m", "forkless.entrypoints.cli.main", "plugins", "list"]
    env = plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS_STRICT="1", FORKLESS_PLUGINS="+example_hello")
    proc = run_forkless(["plugins", "bisect", "--", *cmd], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    # every installed example plugin that loads by default, plus the opt-in example_hello
    count, _, listed = out[0].removeprefix("bisecting ").partition(" plugin(s): ")
    candidates = listed.split(", ")
    assert int(count) == len(candidates) and candidates == sorted(candidates)
    assert {"broken_call", "example_hello", "example_model", "incompatible", "nonreentrant"} <= set(candidates)
    culprits = [ln for ln in out if ln.startswith("culprit: ")]
    assert culprits == [
        "culprit: broken_call (the command fails when it is loaded, on its own)",
        "culprit: broken_detector (the command fails when it is loaded, on its own)",
        "culprit: broken_import (the command fails when it is loaded, on its own)",
        "culprit: incompatible (the command fails when it is loaded, on its own)",
    ]
    found = ["broken_call", "broken_detector", "broken_import", "incompatible"]
    assert (f"  without broken_call ({len(candidates) - 1} plugin(s)): still fails: more than one "
            "culprit, bisecting the rest") in out
    assert f"  without {', '.join(found)} ({len(candidates) - 4} plugin(s)): passes" in out
    assert out[-2:] == [
        f"culprits: {', '.join(found)} (the command passes only without all of them)",
        f"run without them: FORKLESS_PLUGINS={','.join(n for n in candidates if n not in found)}",
    ]
    # and the suggestion holds
    proc = run_forkless(["plugins", "list"], plugin_env(
        plugin_site, tmp_path, FORKLESS_PLUGINS_STRICT="1", FORKLESS_PLUGINS=out[-1].split("=", 1)[1]))
    assert proc.returncode == 0, proc.stderr


def test_an_entry_point_in_a_misspelt_group_is_named_with_the_group_meant(tmp_path: Path) -> None:
    """``forkless.general_plugin`` (no s) is no group forkless reads: list and check say so
    and name the group meant, where list showed "discovered" and check contradicted itself
    ("no installed plugin 'x' in group forkless.general_plugin")."""
    site = tmp_path / "site"
    fake_plugin(site, "typo_group", "def register():\n    pass\n", group="forkless.general_plugin")
    env = plugin_env(site, tmp_path)
    listed = run_forkless(["plugins", "list", "--json"], env)
    (row,) = [r for r in json.loads(listed.stdout) if r["name"] == "typo_group"]
    assert row["status"] == "unknown-group"
    assert "forkless reads no entry-point group 'forkless.general_plugin'" in row["error"]
    assert "did you mean forkless.general_plugins?" in row["error"]
    checked = run_forkless(["plugins", "check", "--json", "typo_group"], env)
    (result,) = json.loads(checked.stdout)
    assert checked.returncode == 1 and not result["ok"]
    assert result["problems"] == [row["error"]]
    misspelt = run_forkless(["plugins", "check", "typo_grup"], env)
    assert misspelt.returncode == 2
    assert misspelt.stderr.startswith("forkless plugins check: error: no installed plugin named typo_grup "
                                      "(did you mean typo_group?)"), misspelt.stderr


def test_check_calls_out_a_slow_load(tmp_path: Path) -> None:
    """The README says check judges the load time: a plugin whose loading takes seconds is
    said to cost that in every process that loads it (it printed "ok ... load 12000 ms")."""
    site = tmp_path / "site"
    fake_plugin(site, "slow_plugin", "import time\ntime.sleep(1.1)\n\ndef register():\n    pass\n")
    proc = run_forkless(["plugins", "check", "slow_plugin"], plugin_env(site, tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "note: slow: loading took 1.1 s, paid at every start (loaded in: every process)" in proc.stdout
