"""Tiny random Llama / Qwen2 / Qwen3 models shaped to exercise tensor parallelism."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import _TINY, save_tokenizer

# An odd vocabulary (the engine tests' tokenizer has 384 - 16 tokens of its own, so every
# id it makes is inside): the last rank's share of it is padded.
ODD_VOCAB = 383
PROMPTS = ["The quick brown fox", "Paris is the capital of", "Hello world! Streaming tokens", "Numbers 0123"]


def make_tp_model(folder: Path, arch: str, seed: int = 0) -> Path:
    """A tiny random model of ``arch``: Llama untied with 2 KV heads and an odd vocabulary;
    Qwen2 with 1 KV head (replicated on both of 2 ranks), q/k/v biases and a tied head;
    Qwen3 with q/k norms, a tied head and an odd vocabulary."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(**dict(_TINY, vocab_size=ODD_VOCAB), tie_word_embeddings=False)
    elif arch == "qwen2":
        config = Qwen2Config(**dict(_TINY, num_key_value_heads=1), tie_word_embeddings=True)
    elif arch == "qwen3":
        config = Qwen3Config(**dict(_TINY, vocab_size=ODD_VOCAB), head_dim=32, tie_word_embeddings=True)
    else:
        raise ValueError(arch)
    AutoModelForCausalLM.from_config(config).eval().save_pretrained(folder)
    save_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tp_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tp-models")
    return {arch: make_tp_model(root / arch, arch) for arch in ("llama", "qwen2", "qwen3")}
