"""Weight iteration, dtype resolution and load_model."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from forkless.model_loader import iterate_weights, load_model, resolve_dtype
from forkless.models.qwen3 import Qwen3ForCausalLM
from forkless.models.registry import UnsupportedArchitectureError

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**TINY))
    folder = tmp_path_factory.mktemp("sharded")
    model.save_pretrained(folder, max_shard_size="40KB")
    return folder, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_resolve_dtype():
    cfg = LlamaConfig(**TINY, dtype="bfloat16")
    assert resolve_dtype("auto", cfg, "cpu") is torch.float32
    assert resolve_dtype("auto", cfg, torch.device("cuda", 0)) is torch.bfloat16
    assert resolve_dtype("auto", LlamaConfig(**TINY), "cuda") is torch.float32
    assert resolve_dtype("half", cfg, "cpu") is torch.float16
    assert resolve_dtype("BFloat16", cfg, "cpu") is torch.bfloat16
    assert resolve_dtype(torch.float16, cfg, "cpu") is torch.float16
    with pytest.raises(ValueError, match="auto.*float32.*bfloat16.*float16"):
        resolve_dtype("float8", cfg, "cpu")
    with pytest.raises(ValueError, match="choose one of"):
        resolve_dtype(torch.int8, cfg, "cpu")


def test_iterate_sharded_weights_follows_index(sharded_dir):
    folder, state = sharded_dir
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "fixture should be sharded"
    # A stray full copy must not be read: only the index decides.
    save_file({"model.norm.weight": torch.zeros(64)}, str(folder / "consolidated.safetensors"))
    try:
        got = dict(iterate_weights(folder, torch.bfloat16))
    finally:
        (folder / "consolidated.safetensors").unlink()
    assert set(got) == set(index["weight_map"])
    for name, tensor in got.items():
        assert tensor.dtype is torch.bfloat16
        torch.testing.assert_close(tensor, state[name].to(torch.bfloat16), rtol=0, atol=0)


def test_no_weights_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="safetensors"):
        list(iterate_weights(tmp_path))


def test_load_model_sharded_matches_state(sharded_dir):
    folder, state = sharded_dir
    model = load_model(folder, None, "auto", "cpu", "torch")
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())
    assert (model.num_layers, model.num_kv_heads, model.head_dim) == (2, 2, 16)
    qkv = model.model.layers[1].self_attn.qkv_proj.weight
    expected = torch.cat([state[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv"])
    torch.testing.assert_close(qkv, expected, rtol=0, atol=0)
    gate_up = model.model.layers[0].mlp.gate_up_proj.weight
    expected = torch.cat([state[f"model.layers.0.mlp.{n}_proj.weight"] for n in ("gate", "up")])
    torch.testing.assert_close(gate_up, expected, rtol=0, atol=0)


def test_missing_weight_names_the_parameter(tmp_path):
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**TINY)).save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.qkv_proj\.weight"):
        load_model(tmp_path, None, torch.float32, "cpu", "torch")


def test_wrong_shape_names_both(tmp_path):
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**TINY)).save_pretrained(tmp_path)
    cfg = AutoConfig.from_pretrained(tmp_path)
    cfg.intermediate_size = 96
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.\w+\.weight. has shape .*expects"):
        load_model(tmp_path, cfg, torch.float32, "cpu", "torch")


def test_dummy_load_is_seeded_and_runs(tmp_path):
    cfg = AutoConfig.for_model("qwen3", **TINY, head_dim=16)
    cfg.architectures = ["Qwen3ForCausalLM"]
    a = load_model(tmp_path, cfg, "float32", "cpu", "torch", load_format="dummy")
    b = load_model(tmp_path, cfg, "float32", "cpu", "torch", load_format="dummy")
    assert isinstance(a, Qwen3ForCausalLM)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0, msg=name)
    assert a.model.layers[0].self_attn.q_norm.weight.abs().max() > 0


def test_bad_arguments(tmp_path):
    cfg = LlamaConfig(**TINY)
    cfg.architectures = ["LlamaForCausalLM"]
    with pytest.raises(ValueError, match="auto, dummy"):
        load_model(tmp_path, cfg, "float32", "cpu", "torch", load_format="gguf")
    cfg.architectures = ["NoSuchForCausalLM"]
    with pytest.raises(UnsupportedArchitectureError, match="LlamaForCausalLM"):
        load_model(tmp_path, cfg, "float32", "cpu", "torch", load_format="dummy")


def test_bfloat16_matches_hf_bfloat16(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from paged_harness import PagedHarness

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**TINY)).save_pretrained(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    model = load_model(tmp_path, None, "bfloat16", "cpu", "torch")
    assert model.model.embed_tokens.weight.dtype is torch.bfloat16
    harness = PagedHarness(model, type(model.model.layers[0].self_attn.attn))
    tokens = list(range(5, 19))
    got = torch.cat([harness.step([("a", tokens[:9])])[0], harness.step([("a", tokens[9:])])[0]])
    assert got.dtype is torch.bfloat16  # the model's dtype, as Hugging Face's
    with torch.inference_mode():
        ref = hf(torch.tensor([tokens])).logits[0]
    assert ref.dtype is torch.bfloat16
    torch.testing.assert_close(got.float(), ref.float(), rtol=0, atol=2e-2)
