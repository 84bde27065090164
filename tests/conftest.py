"""Shared fixtures: the example plugin packages, installed for real, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "plugins"


def install_packages(target: Path, packages: list[Path]) -> None:
    """``pip install`` packages into a site directory (discovered via ``PYTHONPATH``)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--no-index", "--target", str(target),
         *map(str, packages)],
        check=True,
    )


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site directory with every example plugin package under examples/plugins/ installed."""
    target = tmp_path_factory.mktemp("plugin-site")
    install_packages(target, sorted(p for p in EXAMPLES.iterdir() if (p / "pyproject.toml").exists()))
    return target


def plugin_env(site: Path | None, tmp_path: Path, **extra: str | None) -> dict[str, str]:
    """A clean environment for a forkless subprocess that sees the plugins in ``site``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKLESS_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site) if site else "", env.get("PYTHONPATH", "")) if p)
    env["FORKLESS_CACHE_ROOT"] = str(tmp_path / "cache")
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_python(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)


def run_forkless(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forkless.entrypoints.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
