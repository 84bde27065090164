"""The plain ``Requires-Dist: forkless...`` forms are decided without packaging, and
every verdict equals packaging's (PEP 440)."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from forkless.plugins._requires import UNDECIDED, check_plain

VERSIONS = ["0", "0.1", "0.1.0", "0.2", "1", "1.0", "1.0.0", "1.2.3", "2.0.1", "10.0"]
OPS = ["==", "!=", ">=", "<=", ">", "<", "~="]


def packaging_verdict(line: str, running: str) -> str | None:
    req = Requirement(line)
    if req.name.lower().replace("_", "-") != "forkless":
        return None
    return None if req.specifier.contains(Version(running), prereleases=True) else str(req.specifier)


@pytest.mark.parametrize("running", ["0.1.0", "0.2", "1.0.0", "1.2.3"])
def test_every_plain_clause_and_pair_agrees_with_packaging(running: str) -> None:
    pairs = [(op, v) for op in OPS for v in VERSIONS if not (op == "~=" and "." not in v)]
    clauses = [op + v for op, v in pairs]
    lines = [f"forkless{c}" for c in clauses] + [f"forkless {op} {v}" for op, v in pairs[::4]]
    lines += [f"forkless{a},{b}" for a, b in itertools.product(clauses[::5], clauses[2::7])]
    lines += [f"forkless ({c})" for c in clauses[::3]]
    lines += ["forkless", "Forkless>=0.1", "forkless_ext>=99", "forkless.ext>=99"]
    decided = 0
    for line in lines:
        verdict = check_plain(line, running)
        if verdict is UNDECIDED:
            # Only two spellings of one clause (">=1,>=1.0"), which packaging's set merges.
            texts = {c.replace(" ", "") for c in line[len("forkless"):].strip(" ()").split(",")}
            assert len(str(Requirement(line).specifier).split(",")) < len(texts), line
            continue
        decided += 1
        assert verdict == packaging_verdict(line, running), line
    assert decided > 0.95 * len(lines)


@pytest.mark.parametrize("line", ["forkless>=0.1; python_version>'3'", "forkless==0.1.*", "forkless>=0.1rc1",
                                  "forkless[extra]>=0.1", "forkless===0.1.0", "forkless~=1", "forkless>=0.1.post1"])
def test_other_forms_are_left_to_packaging(line: str) -> None:
    assert check_plain(line, "0.1.0") is UNDECIDED


def test_a_prerelease_forkless_is_left_to_packaging() -> None:
    assert check_plain("forkless>=0.1", "0.2.0rc1") is UNDECIDED


def test_loading_a_plain_requirement_does_not_import_packaging(tmp_path) -> None:
    """What the benchmark's timed region imported on the first plugin load."""
    site = tmp_path / "site"
    info = site / "plainreq-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plainreq\nVersion: 1.0\n"
                                   "Requires-Dist: forkless<99,>=0.1\n\n")
    (info / "entry_points.txt").write_text("[forkless.general_plugins]\nplainreq = plainreq:register\n")
    (site / "plainreq.py").write_text("def register():\n    pass\n")
    code = ("import sys, forkless.plugins as p\np.load_general_plugins()\n"
            "assert [r.status for r in p.plugin_records() if r.name == 'plainreq'] == ['loaded']\n"
            "print('packaging' in sys.modules)")
    env = {"PYTHONPATH": str(site), "FORKLESS_CACHE_ROOT": str(tmp_path / "cache"), "FORKLESS_PLUGINS": "plainreq",
           "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
