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


def test_entry_points_rewritten_in_place_are_seen(tmp_path: Path) -> None:
    """setuptools' egg_info rewrites an editable install's entry_points.txt in place: neither
    the site directory's nor the metadata folder's mtime moves, the file's does."""
    import os

    site = tmp_path / "site"
    install_packages(site, [EXAMPLES / "forkless-example-model"])
    assert [e[1] for e in discover(site, tmp_path, "1") if e[2] != "forkless"] == ["example_model"]
    (eps,) = site.glob("*.dist-info/entry_points.txt")
    folder = os.stat(eps.parent)
    text = eps.read_text()
    with open(eps, "w") as f:  # the same file (inode), new contents
        f.write(text.replace("example_model", "example_model_renamed"))
    os.utime(eps, ns=(folder.st_atime_ns, folder.st_mtime_ns + 10**9))
    assert os.stat(eps.parent).st_mtime_ns == folder.st_mtime_ns
    after = discover(site, tmp_path, "1")
    assert [e[1] for e in after if e[2] != "forkless"] == ["example_model_renamed"]
    assert after == discover(site, tmp_path, "0")
