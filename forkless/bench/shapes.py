"""Model folders of well-known shapes, written locally (no hub): config + a word-level
tokenizer, and optionally random weights. Benchmarks load them with ``--load-format
dummy``; GPU tests save real random weights so two engines load identical models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
        "attention_bias": False, "bos_token_id": 151643, "eos_token_id": 151645,
    },
    "llama3-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": 128001,
    },
}


def write_tokenizer(out: Path, vocab_size: int, eos_token_id: int) -> None:
    """A word-level tokenizer whose token ``i`` is the word ``t{i}`` (any id decodes)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = Tokenizer(WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": f"t{eos_token_id}",
        "unk_token": "t0", "model_max_length": 1 << 20,
    }))


def write_model_folder(out: Path, shape: str, dtype: str = "bfloat16", num_layers: int | None = None,
                       weights: bool = False, seed: int = 0) -> Path:
    """Write a model folder of a known shape.

    Args:
        out: Folder to create.
        shape: A key of :data:`SHAPES`.
        dtype: The config's dtype (what ``--dtype auto`` picks).
        num_layers: Override the depth (smaller test models of real width).
        weights: Also save random weights (transformers' own initialisation, seeded).
        seed: Seeds the weights.

    Returns:
        ``out``.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(sorted(SHAPES))}")
    cfg = dict(SHAPES[shape], dtype=dtype)
    if num_layers is not None:
        cfg["num_hidden_layers"] = num_layers
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg["eos_token_id"]}))
    write_tokenizer(out, cfg["vocab_size"], cfg["eos_token_id"])
    if weights:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out), dtype=torch.float32)
        model.save_pretrained(out, safe_serialization=True)
        (out / "config.json").write_text(json.dumps(cfg, indent=1))  # keep our dtype field
    return out
