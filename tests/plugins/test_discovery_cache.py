"""The entry-point cache: same answers as a scan, and invalidated by installs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.conftest import install_packages, plugin_env, run_python, EXAMPLES

DISCOVER = textwrap.dedent("""
    import json
    from forkless.plugins._discovery import discover_entry_points
    print(json.dumps(sorted((e.group, e.name, e.dist, e.version) for e in discover_entry_points())))
""")


def discover(site: Path, tmp_path: Path, cache: str) -> list:
    proc = run_python(DISCOVER, plugin_env(site, tmp_path, FORKLESS_PLUGIN_CACHE=cache))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_cache_matches_scan_and_sees_new_installs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install_packages(site, [EXAMPLES / "forkless-example-model"])
    scanned = discover(site, tmp_path, "0")
    # forkless's own plugins (its LoRA filesystem resolver) are found too; these tests are about the site.
    assert [e[1] for e in scanned if e[2] != "forkless"] == ["example_model"]
    assert not (tmp_path / "cache" / "entry_points").exists()  # cache off: nothing written
    assert discover(site, tmp_path, "1") == scanned
    assert len(list((tmp_path / "cache" / "entry_points").glob("*.json"))) == 1
    assert discover(site, tmp_path, "1") == scanned  # served from the cache
    install_packages(site, [EXAMPLES / "forkless-example-endpoint"])
    after = discover(site, tmp_path, "1")
    assert [e[1] for e in after if e[2] != "forkless"] == ["example_hello", "example_model"]
    assert after == discover(site, tmp_path, "0")


def test_corrupt_cache_is_ignored(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install_packages(site, [EXAMPLES / "forkless-example-model"])
    first = discover(site, tmp_path, "1")
    for f in (tmp_path / "cache" / "entry_points").glob("*.json"):
        f.write_text("{not json")
    assert discover(site, tmp_path, "1") == first
