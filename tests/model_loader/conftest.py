"""Fixtures of the model-loader tests: a private cache root (the converted default model,
``smollm2_folder``, comes from tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point ``FORKLESS_CACHE_ROOT`` at a fresh directory, so no test touches ~/.cache."""
    root = tmp_path / "forkless-cache"
    monkeypatch.setenv("FORKLESS_CACHE_ROOT", str(root))
    return root
