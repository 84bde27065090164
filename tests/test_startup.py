"""What a user sees when installing and starting forkless: no warnings, early errors, a
log line per phase.

Every test runs real processes: the build backend on ``pyproject.toml``, and
``forkless serve`` on a loopback port.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------ packaging


def test_building_the_metadata_prints_no_deprecation_warning(tmp_path: Path) -> None:
    """The build backend accepts pyproject.toml as written (PEP 639 licence string)."""
    import setuptools

    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    backend = next(Requirement(r) for r in requires if Requirement(r).name == "setuptools")
    assert backend.specifier.contains(setuptools.__version__), (
        f"the venv's setuptools {setuptools.__version__} does not satisfy {backend}")
    code = ("import sys; from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-W", "always", "-c", code, str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "deprecat" not in (proc.stdout + proc.stderr).lower(), proc.stderr[-3000:]
    metadata = next(tmp_path.glob("*.dist-info/METADATA")).read_text()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
