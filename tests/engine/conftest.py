"""Fixtures: tiny random models saved to disk, and a helper to build engines on them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import make_model


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    # The machine is shared; tiny models gain nothing from more threads.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny-qwen3"), "qwen3")


@pytest.fixture(scope="session")
def hf_llama(llama_dir: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model
