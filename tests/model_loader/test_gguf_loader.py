"""GGUF -> Hugging Face folder conversion, checked against ``transformers`` on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from forkless.model_loader import gguf_loader
from forkless.model_loader.gguf_loader import (
    MARKER_FILE,
    GGUFConversionError,
    convert_gguf_to_hf,
    is_gguf,
)
from tests.model_loader.tiny_gguf import (
    CHAT_TEMPLATE,
    HEADS,
    KV_HEADS,
    RMS_EPS,
    ROPE_THETA,
    TinyGGUF,
    write_tiny_llama_gguf,
)

QTYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"]


def _logits(model: torch.nn.Module, seed: int = 0) -> torch.Tensor:
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture
def tiny(tmp_path: Path) -> TinyGGUF:
    return write_tiny_llama_gguf(tmp_path / "tiny.gguf")


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("qtype", QTYPES)
def test_round_trip_matches_transformers(tmp_path: Path, qtype: str, tie: bool) -> None:
    tiny = write_tiny_llama_gguf(tmp_path / "m.gguf", gguf.GGMLQuantizationType[qtype], tie)
    # The file really holds llama.cpp's permuted order, so the comparison below tests the unpermute.
    assert not np.array_equal(tiny.stored_q, tiny.reference_q)

    folder = convert_gguf_to_hf(tiny.path, tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)

    torch.testing.assert_close(_logits(model), _logits(tiny.reference), rtol=0, atol=1e-5)
    with safe_open(folder / "model.safetensors", "pt") as f:
        assert ("lm_head.weight" in f.keys()) is not tie
    assert model.config.tie_word_embeddings is tie


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_round_trip_matches_transformers(tmp_path: Path, model_type: str) -> None:
    tiny = write_tiny_llama_gguf(tmp_path / "m.gguf", architecture=model_type, model_type=model_type)
    folder = convert_gguf_to_hf(tiny.path, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [f"{model_type.capitalize()}ForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert type(model) is type(tiny.reference)
    torch.testing.assert_close(_logits(model), _logits(tiny.reference), rtol=0, atol=1e-5)


def test_logits_differ_without_the_unpermute(tiny: TinyGGUF, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the test above: skipping the q/k fix-up must be visible in the logits."""
    monkeypatch.setattr(gguf_loader, "_PERMUTED_ARCHITECTURES", set())
    model = AutoModelForCausalLM.from_pretrained(convert_gguf_to_hf(tiny.path, tmp_path / "hf"))
    assert not torch.allclose(_logits(model), _logits(tiny.reference), atol=1e-3)


def test_config_carries_the_gguf_hyperparameters(tiny: TinyGGUF, tmp_path: Path) -> None:
    config = json.loads((convert_gguf_to_hf(tiny.path, tmp_path / "hf") / "config.json").read_text())
    ref = tiny.reference.config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["rope_theta"] == ROPE_THETA
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": ROPE_THETA}
    assert config["rms_norm_eps"] == RMS_EPS  # exactly, not float32-rounded
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "bos_token_id", "eos_token_id",
                "tie_word_embeddings"):
        assert config[key] == getattr(ref, key), key
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (HEADS, KV_HEADS)


def test_config_agrees_with_transformers_gguf_reader(tiny: TinyGGUF, tmp_path: Path) -> None:
    ours = AutoConfig.from_pretrained(convert_gguf_to_hf(tiny.path, tmp_path / "hf"))
    theirs = AutoConfig.from_pretrained(tiny.path.parent, gguf_file=tiny.path.name)
    for key in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                "bos_token_id", "eos_token_id", "tie_word_embeddings"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps, rel=1e-6)


def test_generation_config(tiny: TinyGGUF, tmp_path: Path) -> None:
    generation = json.loads((convert_gguf_to_hf(tiny.path, tmp_path / "hf") / "generation_config.json").read_text())
    assert generation["bos_token_id"] == tiny.reference.config.bos_token_id
    assert generation["eos_token_id"] == tiny.reference.config.eos_token_id


def test_tokenizer_and_chat_template(tiny: TinyGGUF, tmp_path: Path) -> None:
    folder = convert_gguf_to_hf(tiny.path, tmp_path / "hf")
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == CHAT_TEMPLATE
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"

    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "the tin"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\nthe tin<|im_end|>\n<|im_start|>assistant\n"
    tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode("the tin<|im_end|>"))
    # Merges from the file are applied, and special tokens stay whole.
    assert tokens == ["t", "he", "Ġt", "in", "<|im_end|>"]
    assert tokenizer.decode(tokenizer.encode("the tin on a")) == "the tin on a"
    assert tokenizer.eos_token == "<|im_end|>"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype(tiny: TinyGGUF, tmp_path: Path, dtype: str) -> None:
    folder = convert_gguf_to_hf(tiny.path, tmp_path / "hf", dtype=dtype)
    with safe_open(folder / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {getattr(torch, dtype)}
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == dtype
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    torch.testing.assert_close(_logits(model), _logits(tiny.reference), rtol=0.05, atol=0.05)


def test_is_gguf(tiny: TinyGGUF, tmp_path: Path) -> None:
    text = tmp_path / "fake.gguf"
    text.write_text("not a gguf")
    assert is_gguf(tiny.path)
    assert not is_gguf(text)
    assert not is_gguf(tmp_path)
    assert not is_gguf(tmp_path / "missing.gguf")


def test_marker_records_the_source(tiny: TinyGGUF, tmp_path: Path) -> None:
    marker = json.loads((convert_gguf_to_hf(tiny.path, tmp_path / "hf") / MARKER_FILE).read_text())
    assert marker["source"]["path"] == str(tiny.path.resolve())
    assert marker["source"]["size"] == tiny.path.stat().st_size
    assert marker["converter_version"] == gguf_loader.CONVERTER_VERSION


def test_bad_inputs_are_clear_errors(tiny: TinyGGUF, tmp_path: Path) -> None:
    text = tmp_path / "fake.gguf"
    text.write_text("not a gguf")
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        convert_gguf_to_hf(tmp_path / "missing.gguf", tmp_path / "a")
    with pytest.raises(GGUFConversionError, match="not a GGUF file"):
        convert_gguf_to_hf(text, tmp_path / "b")
    with pytest.raises(ValueError, match="dtype"):
        convert_gguf_to_hf(tiny.path, tmp_path / "c", dtype="int8")
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        convert_gguf_to_hf(tiny.path, tmp_path / "exists")


def test_unsupported_architecture_leaves_nothing_behind(tmp_path: Path) -> None:
    source = write_tiny_llama_gguf(tmp_path / "src" / "gpt2.gguf", architecture="gpt2").path
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(GGUFConversionError, match=r"'gpt2' is not supported; supported: \['llama', 'qwen2', 'qwen3'\]"):
        convert_gguf_to_hf(source, out / "hf")
    assert list(out.iterdir()) == []


def test_overwrite_replaces_the_folder(tiny: TinyGGUF, tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "stale.txt").write_text("old")
    convert_gguf_to_hf(tiny.path, folder, overwrite=True)
    assert not (folder / "stale.txt").exists()
    assert (folder / MARKER_FILE).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "tiny.gguf"]


def test_losing_a_race_returns_the_winners_folder(tiny: TinyGGUF, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process publishes the same folder while we convert: our rename loses, cleanly."""
    out = tmp_path / "hf"
    real_write = gguf_loader._write_folder
    calls = []

    def write_then_get_overtaken(gguf_path: Path, tmp: Path, dtype: str) -> None:
        calls.append(tmp)
        real_write(gguf_path, tmp, dtype)
        if len(calls) == 1:
            convert_gguf_to_hf(gguf_path, out, dtype)  # the "other process" wins

    monkeypatch.setattr(gguf_loader, "_write_folder", write_then_get_overtaken)
    assert convert_gguf_to_hf(tiny.path, out) == out
    assert len(calls) == 2
    assert (out / MARKER_FILE).is_file() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "tiny.gguf"]  # no temp dirs left


def test_rope_freqs_tensor_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rope.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("rope_freqs.weight", np.ones(8, dtype=np.float32))
    writer.add_tensor("token_embd.weight", np.ones((4, 32), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.ones((32, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFConversionError, match="rope_freqs"):
        convert_gguf_to_hf(path, tmp_path / "hf")
