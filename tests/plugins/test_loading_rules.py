"""Every loading rule of DESIGN.md §2, on the example plugin packages installed for real.

Each case runs in a fresh interpreter, as a forkless process would start.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import plugin_env, run_python

LOAD_AND_REPORT = textwrap.dedent("""
    import json, sys
    from forkless.plugins import load_general_plugins, plugin_records
    from forkless import ModelRegistry
    load_general_plugins()
    load_general_plugins()
    print(json.dumps({
        "records": {r.name: r.to_dict() for r in plugin_records()},
        "archs": ModelRegistry.get_supported_archs(),
    }))
""")


def load(site: Path, tmp_path: Path, **env: str | None) -> tuple[dict, str]:
    proc = run_python(LOAD_AND_REPORT, plugin_env(site, tmp_path, **env))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_unset_loads_all_but_opt_in(plugin_site: Path, tmp_path: Path) -> None:
    report, log = load(plugin_site, tmp_path)
    status = {name: r["status"] for name, r in report["records"].items()}
    assert status["example_model"] == "loaded"
    assert status["example_hello"] == "opt-in"
    assert "ToyLlamaForCausalLM" in report["archs"]
    assert report["records"]["example_model"]["load_ms"] > 0


def test_comma_list_with_whitespace_selects_only_those(plugin_site: Path, tmp_path: Path) -> None:
    report, _ = load(plugin_site, tmp_path, FORKLESS_PLUGINS=" nonreentrant ,  example_hello ")
    status = {name: r["status"] for name, r in report["records"].items()}
    assert status["nonreentrant"] == "loaded"
    assert status["example_model"] == "filtered"
    assert status["broken_call"] == "filtered"
    assert "ToyLlamaForCausalLM" not in report["archs"]
    assert "NonReentrantForCausalLM" in report["archs"]


def test_empty_string_loads_none(plugin_site: Path, tmp_path: Path) -> None:
    report, log = load(plugin_site, tmp_path, FORKLESS_PLUGINS="")
    assert {r["status"] for r in report["records"].values()} <= {"filtered", "opt-in"}
    assert "ToyLlamaForCausalLM" not in report["archs"]
    assert "Traceback" not in log


def test_unknown_name_warns_with_available_names(plugin_site: Path, tmp_path: Path) -> None:
    report, log = load(plugin_site, tmp_path, FORKLESS_PLUGINS="example_model,exmaple_hello")
    assert "FORKLESS_PLUGINS names 'exmaple_hello', but no installed plugin has that name" in log
    assert "example_hello" in log.split("exmaple_hello")[-1]  # the list of real names follows
    assert report["records"]["example_model"]["status"] == "loaded"


def test_misspelled_name_gets_a_did_you_mean(plugin_site: Path, tmp_path: Path) -> None:
    _, log = load(plugin_site, tmp_path, FORKLESS_PLUGINS="example_model,exmaple_hello,zzzzqqq")
    assert ("FORKLESS_PLUGINS names 'exmaple_hello', but no installed plugin has that name; "
            "did you mean 'example_hello'? installed plugins: broken_call, broken_detector") in log
    # nothing close: the list of installed names only
    assert "FORKLESS_PLUGINS names 'zzzzqqq', but no installed plugin has that name; installed plugins: " in log
    # a +name is checked too, and the suggestion keeps the +
    _, log = load(plugin_site, tmp_path, FORKLESS_PLUGINS="+exampel_hello")
    assert "FORKLESS_PLUGINS names '+exampel_hello', but no installed plugin has that name; did you mean '+example_hello'?" in log


def test_failure_isolation_names_plugin_distribution_traceback(plugin_site: Path, tmp_path: Path) -> None:
    report, log = load(plugin_site, tmp_path)
    rec = report["records"]
    assert rec["broken_call"]["status"] == "failed"
    assert rec["broken_import"]["status"] == "failed"
    assert "ModuleNotFoundError" in rec["broken_import"]["error"]
    assert "plugin 'broken_call' from distribution forkless-example-broken 0.1.0 is skipped" in log
    assert "Traceback (most recent call last)" in log and "fails on purpose" in log
    assert rec["example_model"]["status"] == "loaded"  # the others carry on


def test_strict_mode_aborts(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_python(LOAD_AND_REPORT, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS_STRICT="1"))
    assert proc.returncode != 0
    assert "PluginLoadError" in proc.stderr and "'broken_import'" in proc.stderr
    assert "FORKLESS_PLUGINS_STRICT=1" in proc.stderr
    # strict mode with only healthy plugins starts fine
    report, _ = load(plugin_site, tmp_path, FORKLESS_PLUGINS_STRICT="1", FORKLESS_PLUGINS="example_model")
    assert report["records"]["example_model"]["status"] == "loaded"


def test_strict_mode_reports_every_failure_and_each_traceback_once(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_python(LOAD_AND_REPORT, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS_STRICT="1"))
    assert proc.returncode != 0
    err = proc.stderr
    # one error names every failed general plugin: import, call and version failures
    error = err[err.index("PluginLoadError: "):]
    assert error.startswith("PluginLoadError: 3 plugin(s) failed and FORKLESS_PLUGINS_STRICT=1 aborts startup")
    for name in ("'broken_import'", "'broken_call'", "'incompatible'"):
        assert name in error
    assert "Traceback" not in error and "nonreentrant" not in error  # healthy ones still load
    # each plugin's traceback is printed exactly once (logged), never chained again
    assert err.count('raise RuntimeError("forkless-example-broken: this plugin fails on purpose")') == 1
    assert err.count("in _find_and_load_unlocked") == 1  # the frame of broken_import's traceback
    assert "During handling of the above exception" not in err
    for name in ("'broken_import'", "'broken_call'", "'incompatible'"):
        assert err.count(f"plugin {name} from distribution") == 1  # logged once


def test_incompatible_requires_dist_is_skipped(plugin_site: Path, tmp_path: Path) -> None:
    report, log = load(plugin_site, tmp_path, FORKLESS_PLUGINS="incompatible")
    rec = report["records"]["incompatible"]
    assert rec["status"] == "incompatible"
    assert "requires forkless>=99, but the running forkless is 0.1.0" in rec["error"]
    assert "requires forkless>=99, but the running forkless is 0.1.0" in log
    proc = run_python(LOAD_AND_REPORT, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="incompatible",
                                                  FORKLESS_PLUGINS_STRICT="1"))
    assert proc.returncode != 0 and "requires forkless>=99" in proc.stderr


def test_load_general_plugins_runs_once_per_process(plugin_site: Path, tmp_path: Path) -> None:
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    load(plugin_site, tmp_path, FORKLESS_PLUGINS="example_model", FORKLESS_EXAMPLE_RECORD_DIR=str(record_dir))
    lines = [json.loads(ln) for f in record_dir.iterdir() for ln in f.read_text().splitlines()]
    assert [ln["event"] for ln in lines] == ["registered"]  # called twice, ran once


def test_deterministic_order_by_name(tmp_path: Path) -> None:
    """Plugins load sorted by entry-point name, whatever the install order."""
    site = tmp_path / "site"
    site.mkdir()
    order_file = tmp_path / "order.txt"
    for dist, name in [("zdist", "alpha"), ("adist", "zeta"), ("mdist", "mid")]:
        (site / f"{dist}_plugin.py").write_text(
            f"def register():\n    open({str(order_file)!r}, 'a').write({name!r} + '\\n')\n")
        info = site / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n\n")
        (info / "entry_points.txt").write_text(f"[forkless.general_plugins]\n{name} = {dist}_plugin:register\n")
    proc = run_python(LOAD_AND_REPORT, plugin_env(site, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert order_file.read_text().split() == ["alpha", "mid", "zeta"]


def test_endpoint_plugins_are_opt_in(plugin_site: Path, tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import json
        from forkless.plugins import load_plugins_by_group
        print(json.dumps(sorted(load_plugins_by_group("forkless.endpoint_plugins"))))
    """)
    proc = run_python(code, plugin_env(plugin_site, tmp_path))
    assert json.loads(proc.stdout.splitlines()[-1]) == []
    assert ("endpoint plugin 'example_hello' (distribution forkless-example-endpoint) is installed "
            "but not enabled; enable it with FORKLESS_PLUGINS=+example_hello") in proc.stderr
    for value in ("example_hello", "+example_hello", " + example_hello ", "example_model,+example_hello"):
        proc = run_python(code, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS=value))
        assert json.loads(proc.stdout.splitlines()[-1]) == ["example_hello"], value
        assert "not enabled" not in proc.stderr
    # the hint keeps the user's own selection: added to an allow-list, or to the +names
    proc = run_python(code, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="example_model"))
    assert "enable it with FORKLESS_PLUGINS=example_model,example_hello" in proc.stderr
    proc = run_python(code, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="+example_model"))
    assert "enable it with FORKLESS_PLUGINS=+example_model,+example_hello" in proc.stderr


LOAD_ALL_GROUPS = textwrap.dedent("""
    import json
    from forkless.plugins import GROUPS, load_general_plugins, load_plugins_by_group, plugin_records
    load_general_plugins()
    for group in GROUPS:
        load_plugins_by_group(group)
    print(json.dumps({r.name: r.status for r in plugin_records()}))
""")


def test_plus_names_are_added_to_the_default_set(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_python(LOAD_ALL_GROUPS, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="+example_hello"))
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout.splitlines()[-1])
    assert status["example_hello"] == "loaded"  # the opt-in plugin, added
    for name in ("example_model", "nonreentrant", "example_stat_logger", "example_force_token"):
        assert status[name] == "loaded", name  # everything that loads by default still does
    assert status["broken_call"] == "failed" and status["incompatible"] == "incompatible"
    assert "filtered" not in status.values()
    assert "no installed plugin has that name" not in proc.stderr


def test_plus_name_in_an_allow_list_counts_as_listed(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_python(LOAD_ALL_GROUPS, plugin_env(plugin_site, tmp_path,
                                                  FORKLESS_PLUGINS="example_model, +example_hello"))
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout.splitlines()[-1])
    assert status["example_model"] == "loaded" and status["example_hello"] == "loaded"
    assert status["nonreentrant"] == "filtered" and status["example_stat_logger"] == "filtered"


PLATFORM = "from forkless.platforms import current_platform; print(current_platform.name)"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"FORKLESS_PLUGINS": "example_cpu"}, "cpu"),  # detector returns None: built-in
        ({"FORKLESS_PLUGINS": "example_cpu", "FORKLESS_EXAMPLE_PLATFORM": "1"}, "example_cpu"),
        ({"FORKLESS_PLUGINS": "", "FORKLESS_EXAMPLE_PLATFORM": "1"}, "cpu"),
        ({"FORKLESS_PLATFORM": "example_cpu", "FORKLESS_EXAMPLE_PLATFORM": "1"}, "example_cpu"),
        ({"FORKLESS_PLATFORM": "cpu", "FORKLESS_EXAMPLE_PLATFORM": "1"}, "cpu"),
    ],
)
def test_platform_selection(plugin_site: Path, tmp_path: Path, env: dict[str, str], expected: str) -> None:
    proc = run_python(PLATFORM, plugin_env(plugin_site, tmp_path, **env))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected


def test_two_active_out_of_tree_platforms_are_an_error(plugin_site: Path, tmp_path: Path) -> None:
    env = plugin_env(plugin_site, tmp_path, FORKLESS_EXAMPLE_PLATFORM="1", FORKLESS_EXAMPLE_PLATFORM_TWIN="1")
    proc = run_python(PLATFORM, env)
    assert proc.returncode != 0
    assert "more than one out-of-tree platform is active: 'example_cpu'" in proc.stderr
    assert "'example_cpu_twin'" in proc.stderr and "FORKLESS_PLATFORM" in proc.stderr


def test_raising_detector_is_a_warning(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_python(PLATFORM, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="broken_detector"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "cpu"
    assert "WARNING" in proc.stderr and "broken_detector" in proc.stderr
    assert "this detector fails on purpose" in proc.stderr
    proc = run_python(PLATFORM, plugin_env(plugin_site, tmp_path, FORKLESS_PLUGINS="broken_detector",
                                           FORKLESS_PLUGINS_STRICT="1"))
    assert proc.returncode != 0


def test_forced_unknown_platform_lists_choices(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_python(PLATFORM, plugin_env(plugin_site, tmp_path, FORKLESS_PLATFORM="tpu"))
    assert proc.returncode != 0
    assert "FORKLESS_PLATFORM='tpu' names no platform; available: " in proc.stderr
    assert "example_cpu" in proc.stderr and "cpu" in proc.stderr
    proc = run_python(PLATFORM, plugin_env(plugin_site, tmp_path, FORKLESS_PLATFORM="example_cpu"))
    assert proc.returncode != 0 and "not available" in proc.stderr
