"""A worker reads built-in models' configs from config.json without transformers
(forkless/models/hf_config.py): every field the models read equals ``AutoConfig``'s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig

from forkless.model_loader.dtype import _config_dtype
from forkless.models.registry import ModelRegistry
from forkless.models.hf_config import (JsonHFConfig, get_head_dim, get_num_kv_heads, get_rope_parameters,
                                       load_hf_config)
from tests.engine.tiny_models import make_model

REQUIRED = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
            "vocab_size": 256}
ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM"}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return [make_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch) for arch in ("llama", "qwen3")]


def _fields(config: Any) -> dict[str, Any]:
    """What forkless's models and worker read from a config (directly or through helpers)."""
    names = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
             "rms_norm_eps", "max_position_embeddings", "architectures")
    out = {name: getattr(config, name) for name in names}
    for name, default in (("hidden_act", "silu"), ("mlp_bias", False), ("attention_bias", False),
                          ("tie_word_embeddings", False), ("sliding_window", None)):
        out[name] = getattr(config, name, default)
    out["window_used"] = bool(out["sliding_window"]) and getattr(config, "use_sliding_window", True)
    out["head_dim"] = get_head_dim(config)
    out["num_kv_heads"] = get_num_kv_heads(config)
    out["rope"] = get_rope_parameters(config)
    out["dtype"] = _config_dtype(config)
    return out


CASES: list[tuple[str, dict[str, Any]]] = []
for model_type in ARCH:
    CASES += [
        (model_type, {}),  # only the required fields: every default
        (model_type, {"num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
                      "tie_word_embeddings": True, "max_position_embeddings": 4096, "rope_theta": 500000.0}),
        (model_type, {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                      "dtype": "float16"}),
        (model_type, {"sliding_window": 1024, "use_sliding_window": True, "attention_bias": True}),
        (model_type, {"sliding_window": 1024, "use_sliding_window": False, "max_window_layers": 1}),
    ]
CASES.append(("mistral", {"sliding_window": None}))
CASES.append(("llama", {"mlp_bias": True, "pretraining_tp": 1}))


@pytest.mark.parametrize("model_type,extra", CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CASES)])
def test_every_field_the_models_read_equals_autoconfig(tmp_path: Path, model_type: str, extra: dict) -> None:
    data = {"model_type": model_type, "architectures": [ARCH[model_type]], **REQUIRED, **extra}
    (tmp_path / "config.json").write_text(json.dumps(data))
    ours = load_hf_config(tmp_path)
    assert isinstance(ours, JsonHFConfig)
    assert _fields(ours) == _fields(AutoConfig.from_pretrained(tmp_path))


def test_the_test_models_and_the_bench_shapes_read_the_same(tiny_dirs: list[Path], tmp_path: Path) -> None:
    from forkless.bench.shapes import SHAPES, write_model_folder

    folders = tiny_dirs + [write_model_folder(tmp_path / shape, shape) for shape in SHAPES]
    for folder in folders:
        ours = load_hf_config(folder)
        if json.loads((folder / "config.json").read_text())["model_type"] in ARCH:
            assert isinstance(ours, JsonHFConfig), folder
        assert _fields(ours) == _fields(AutoConfig.from_pretrained(folder)), folder


def test_other_configs_go_through_autoconfig(tmp_path: Path) -> None:
    # An unknown model type, a config without a required field, and a built-in
    # architecture a plugin re-registered: transformers' own config object.
    cases = [
        {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
        {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **{k: v for k, v in REQUIRED.items()
                                                                         if k != "vocab_size"}},
    ]
    for i, data in enumerate(cases):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(data))
        assert not isinstance(load_hf_config(folder), JsonHFConfig), data
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                                                    **REQUIRED}))
    previous = ModelRegistry.get_path("Qwen3ForCausalLM")
    ModelRegistry.register_model("Qwen3ForCausalLM", "some_plugin.models:MyQwen3")
    try:
        assert not isinstance(load_hf_config(folder), JsonHFConfig)
    finally:
        ModelRegistry.register_model("Qwen3ForCausalLM", previous)


def test_building_a_builtin_model_does_not_import_transformers(tiny_dirs: list[Path]) -> None:
    """What a worker does before serving: read the config, build the model, load weights."""
    code = (
        "import sys, torch\n"
        "from forkless.model_loader import load_model\n"
        f"model = load_model({str(tiny_dirs[0])!r}, None, 'float32', 'cpu', 'torch')\n"
        "print(type(model).__name__, 'transformers' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["LlamaForCausalLM", "False"], proc.stdout + proc.stderr[-2000:]
