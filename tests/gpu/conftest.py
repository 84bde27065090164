"""GPU tests: skipped, with the reason, where CUDA or Triton is missing (CI has no GPU)."""

from __future__ import annotations

import importlib.util

import pytest


def _gpu_missing() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "needs Triton (the paged GPU attention backend); not installed"
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU; none is available on this machine"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _gpu_missing()
    if reason is None:
        return
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def real_size_model(tmp_path_factory: pytest.TempPathFactory):
    """Qwen3-0.6B's width and heads, 4 layers, random float32 weights saved to disk."""
    from forkless.bench.shapes import write_model_folder

    return write_model_folder(tmp_path_factory.mktemp("qwen3-real") / "m", "qwen3-0.6b",
                              dtype="float32", num_layers=4, weights=True)
