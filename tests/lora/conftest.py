"""Tiny random Llama / Qwen2 / Qwen3 models and PEFT adapters made for them (random, non-zero)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import _TINY, save_tokenizer

ARCHS = ("llama", "qwen2", "qwen3")

# name -> (r, lora_alpha, use_rslora, target modules): several ranks and target sets.
ADAPTERS = {
    "all-r8": (8, 16, False, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "qv-r16-rslora": (16, 8, True, ["q_proj", "v_proj"]),
    "mlp-o-r32": (32, 64, False, ["o_proj", "gate_proj", "down_proj"]),
}


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def make_base(folder: Path, arch: str, seed: int = 0, **overrides) -> Path:
    """A tiny random model of ``arch`` with the engine tests' tokenizer."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    torch.manual_seed(seed)
    cfg = dict(_TINY, **overrides)
    if arch == "llama":
        config = LlamaConfig(**cfg, tie_word_embeddings=False)
    elif arch == "qwen2":
        config = Qwen2Config(**cfg, tie_word_embeddings=True)
    elif arch == "qwen3":
        config = Qwen3Config(**cfg, head_dim=32, tie_word_embeddings=True)
    else:
        raise ValueError(arch)
    AutoModelForCausalLM.from_config(config).eval().save_pretrained(folder)
    save_tokenizer(folder)
    return folder


def make_adapter(base: Path, out: Path, r: int, alpha: float, rslora: bool, targets: list[str],
                 seed: int = 1) -> Path:
    """A PEFT LoRA adapter for ``base`` with random non-zero A and B (``init_lora_weights=False``)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=alpha, use_rslora=rslora, target_modules=targets,
                     init_lora_weights=False, lora_dropout=0.0)
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():  # a visible but not overwhelming delta, so greedy text changes
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.3 / (r ** 0.25))
    peft_model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="session")
def lora_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Path]]]:
    """Per architecture: its model folder and its adapters (name -> folder)."""
    out: dict[str, tuple[Path, dict[str, Path]]] = {}
    for arch in ARCHS:
        root = tmp_path_factory.mktemp(f"lora-{arch}")
        base = make_base(root / "base", arch)
        adapters = {name: make_adapter(base, root / name, *spec, seed=i + 1)
                    for i, (name, spec) in enumerate(ADAPTERS.items())}
        out[arch] = (base, adapters)
    return out
