"""Fixtures of the model-loader tests: a private cache root, and the converted default model."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point ``FORKLESS_CACHE_ROOT`` at a fresh directory, so no test touches ~/.cache."""
    root = tmp_path / "forkless-cache"
    monkeypatch.setenv("FORKLESS_CACHE_ROOT", str(root))
    return root


@pytest.fixture(scope="session")
def smollm2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted once per session (~10 s) into its own cache root.

    The cache root is ``smollm2_folder.parent.parent``.
    """
    from forkless.model_loader.default_model import default_model_path

    root = tmp_path_factory.mktemp("smollm2-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORKLESS_CACHE_ROOT", str(root))
        return default_model_path()
