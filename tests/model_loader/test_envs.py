"""``forkless.envs``: lazy, XDG-aware, import-light."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from forkless import envs


def test_cache_root_explicit_value_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("FORKLESS_CACHE_ROOT", str(tmp_path / "explicit"))
    assert envs.FORKLESS_CACHE_ROOT == str(tmp_path / "explicit")


def test_cache_root_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FORKLESS_CACHE_ROOT")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert envs.FORKLESS_CACHE_ROOT == str(tmp_path / "xdg" / "forkless")


def test_cache_root_default_is_under_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FORKLESS_CACHE_ROOT")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert envs.FORKLESS_CACHE_ROOT == str(tmp_path / ".cache" / "forkless")


def test_cache_root_expands_user_and_is_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FORKLESS_CACHE_ROOT", "~/c")
    assert envs.FORKLESS_CACHE_ROOT == str(tmp_path / "c")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FORKLESS_CACHE_ROOT", "rel")
    assert envs.FORKLESS_CACHE_ROOT == str(tmp_path / "rel")


def test_values_are_read_on_every_access(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FORKLESS_CACHE_ROOT", str(tmp_path / "a"))
    first = envs.FORKLESS_CACHE_ROOT
    monkeypatch.setenv("FORKLESS_CACHE_ROOT", str(tmp_path / "b"))
    assert (first, envs.FORKLESS_CACHE_ROOT) == (str(tmp_path / "a"), str(tmp_path / "b"))


def test_unknown_names_are_errors() -> None:
    with pytest.raises(AttributeError, match="FORKLESS_NOPE"):
        envs.FORKLESS_NOPE  # noqa: B018
    with pytest.raises(KeyError, match="FORKLESS_CACHE_ROOT"):
        envs.is_set("FORKLESS_NOPE")
    assert "FORKLESS_CACHE_ROOT" in dir(envs)


def test_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKLESS_CACHE_ROOT", "")
    assert envs.is_set("FORKLESS_CACHE_ROOT")
    monkeypatch.delenv("FORKLESS_CACHE_ROOT")
    assert not envs.is_set("FORKLESS_CACHE_ROOT")


def test_import_is_light() -> None:
    code = "import sys, forkless.envs as e; e.FORKLESS_CACHE_ROOT; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
                            check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("cores,expected", [(1, 1), (2, 1), (8, 2), (16, 4), (64, 4)])
def test_grammar_processes_default_follows_the_cores(monkeypatch: pytest.MonkeyPatch, cores: int,
                                                     expected: int) -> None:
    monkeypatch.delenv("FORKLESS_GRAMMAR_PROCESSES", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert envs.FORKLESS_GRAMMAR_PROCESSES == expected
    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESSES", "3")
    assert envs.FORKLESS_GRAMMAR_PROCESSES == 3
