"""``--quantization gguf``: a GGUF file's Q8_0 / Q4_1 matrices kept quantized and run by the
CPU kernels, against ``transformers`` holding the same (dequantized) values."""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf.quants import dequantize, quantize
from tests.models.paged_harness import PagedHarness
from transformers import AutoConfig

from forkless import LLM, SamplingParams
from forkless.attention import get_attention_backend
from forkless.config import EngineArgs
from forkless.model_loader import load_model
from forkless.model_loader.gguf_loader import convert_gguf_to_hf
from forkless.model_loader.gguf_quantized import read_quantized_matrices, source_gguf, use_gguf_matrices
from forkless.models.layers.gguf_linear import KERNEL_MAX_ROWS, GGUFLinear
from tests.model_loader.tiny_gguf import write_tiny_llama_gguf


# The CPU platform's op implementations (also on a GPU host), kernels loaded.
pytestmark = pytest.mark.usefixtures("ops_on_cpu")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(7, 64), (96, 160), (130, 1024)], ids=str)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_gguf_linear_is_the_dequantized_linear(qtype, shape, bias):
    """The layer's weight is gguf's own dequantization, exactly, and its output
    ``F.linear`` over it at every row count (the kernel up to KERNEL_MAX_ROWS, torch after)."""
    n, k = shape
    rng = np.random.default_rng(n * k)
    stored = quantize(rng.standard_normal((n, k)).astype(np.float32), gguf.GGMLQuantizationType[qtype])
    reference = torch.from_numpy(dequantize(stored, gguf.GGMLQuantizationType[qtype]).reshape(n, k).copy())
    b = torch.from_numpy(rng.standard_normal(n).astype(np.float32)) if bias else None
    layer = GGUFLinear(qtype, stored, k, b)
    assert torch.equal(layer.weight, reference)
    for rows in (1, 2, 3, 4, 5, 9, KERNEL_MAX_ROWS, KERNEL_MAX_ROWS + 1):
        x = torch.randn(rows, k)
        torch.testing.assert_close(layer(x), F.linear(x, reference, b), rtol=1e-5, atol=1e-4)
    x = torch.randn(2, 3, k)  # leading dimensions kept, strided rows read in place
    torch.testing.assert_close(layer(x), F.linear(x, reference, b), rtol=1e-5, atol=1e-4)
    wide = torch.randn(3, 2 * k)
    torch.testing.assert_close(layer(wide[:, :k]), F.linear(wide[:, :k], reference, b), rtol=1e-5, atol=1e-4)


def test_gguf_linear_names_what_it_takes():
    stored = quantize(np.ones((4, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    with pytest.raises(ValueError, match="Q8_0 or Q4_1 weights, got Q4_0"):
        GGUFLinear("Q4_0", stored, 64)
    with pytest.raises(ValueError, match="do not hold 96 weights"):
        GGUFLinear("Q8_0", stored, 96)
    with pytest.raises(ValueError, match="takes float32 CPU input"):
        GGUFLinear("Q8_0", stored, 64)(torch.ones(1, 64, dtype=torch.bfloat16))


def _quantized_model(tiny_path: Path, folder: Path, stack: str = "1"):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORKLESS_CPU_DECODE_STACK", stack)
        model = load_model(folder, AutoConfig.from_pretrained(folder), torch.float32, "cpu",
                           get_attention_backend("cpu"))
        model.use_cpu_kernels()
    count = use_gguf_matrices(model, tiny_path)
    return model, count


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_quantized_layers_give_the_dequantized_models_logits(tmp_path, qtype, model_type, tie):
    """Every projection and the head run on the file's blocks (a llama file's q/k rows put
    back in Hugging Face order), and prefill and decode steps (the decode ones through the
    one-call decode stack) give ``transformers``' logits over the dequantized weights."""
    tiny = write_tiny_llama_gguf(tmp_path / "m.gguf", gguf.GGMLQuantizationType[qtype], tie, architecture=model_type,
                                 model_type=model_type)
    folder = convert_gguf_to_hf(tiny.path, tmp_path / "hf")
    assert source_gguf(folder) == tiny.path.resolve()
    model, count = _quantized_model(tiny.path, folder)
    layers = model.config.num_hidden_layers
    assert count == 4 * layers + 1  # qkv, o, gate_up, down per layer, and the head
    assert all(isinstance(m, GGUFLinear) and m.format == qtype for m in (
        model.lm_head, model.model.layers[0].self_attn.qkv_proj, model.model.layers[1].mlp.down_proj))
    reference = model.model.layers[0].self_attn.qkv_proj.weight[: tiny.reference_q.shape[0]]
    torch.testing.assert_close(reference, torch.from_numpy(tiny.reference_q), rtol=0, atol=0)

    harness = PagedHarness(model, get_attention_backend("cpu"), block_size=4)
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (5, 11, 8)]
    out = harness.step([(f"s{i}", p) for i, p in enumerate(seqs)])
    got = [[o] for o in out]  # each sequence's logits, prefill rows then one row per decode step
    for _ in range(4):
        nxt = [int(o[-1].argmax()) for o in out]
        seqs = [s + [t] for s, t in zip(seqs, nxt)]
        out = harness.step([(f"s{i}", [t]) for i, t in enumerate(nxt)])
        for g, o in zip(got, out):
            g.append(o)
    for s, g in zip(seqs, got):
        with torch.no_grad():
            want = tiny.reference(torch.tensor([s])).logits[0, :-1]
        torch.testing.assert_close(torch.cat(g)[: len(s) - 1], want, rtol=1e-4, atol=1e-4)


def test_decode_stack_takes_quantized_layers_bit_for_bit(tmp_path):
    tiny = write_tiny_llama_gguf(tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q4_1)
    folder = convert_gguf_to_hf(tiny.path, tmp_path / "hf")
    runs = []
    for stack in ("1", "0"):
        model, _ = _quantized_model(tiny.path, folder, stack)
        harness = PagedHarness(model, get_attention_backend("cpu"), block_size=4)
        out = harness.step([("a", [5, 6, 7]), ("b", [9] * 12)])
        steps = []
        for _ in range(3):
            out = harness.step([(s, [int(o[-1].argmax())]) for s, o in zip("ab", out)])
            steps += out
        runs.append(steps)
    for got, want in zip(*runs):
        assert torch.equal(got, want)


def test_other_formats_keep_their_float32_layers(tmp_path):
    """Q4_0 has no kernel here: its matrices stay the float32 layers the folder loads."""
    tiny = write_tiny_llama_gguf(tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q4_0)
    assert read_quantized_matrices(tiny.path) == {}
    model, count = _quantized_model(tiny.path, convert_gguf_to_hf(tiny.path, tmp_path / "hf"))
    assert count == 0 and not any(isinstance(m, GGUFLinear) for m in model.modules())


def test_engine_serves_the_gguf_quantized(tmp_path):
    """Through the engine: greedy tokens as ``transformers`` generates them over the
    dequantized weights."""
    tiny = write_tiny_llama_gguf(tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q4_1)
    llm = LLM(str(tiny.path), quantization="gguf", max_model_len=128, max_num_seqs=4, enable_prefix_caching=False,
              kv_cache_memory=1 << 24)
    try:
        prompts = [[10, 20, 30, 40], [7] * 9]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    finally:
        llm.shutdown()
    for p, o in zip(prompts, outs):
        with torch.no_grad():
            want = tiny.reference.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert list(o.outputs[0].token_ids) == want


def test_flag_parses_as_vllms(tmp_path):
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser(), model_positional=False)
    assert EngineArgs.from_cli_args(parser.parse_args(["--quantization", "gguf"])).quantization == "gguf"
    assert EngineArgs.from_cli_args(parser.parse_args(["-q", "gguf"])).quantization == "gguf"
    assert EngineArgs.from_cli_args(parser.parse_args([])).quantization is None


def test_flag_errors_name_the_problem(tmp_path):
    tiny = write_tiny_llama_gguf(tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q8_0)
    folder = convert_gguf_to_hf(tiny.path, tmp_path / "hf")
    (tmp_path / "plain").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        if (folder / name).exists():
            (tmp_path / "plain" / name).write_bytes((folder / name).read_bytes())
    with pytest.raises(ValueError, match=r"--quantization='awq' is invalid: expected one of gguf"):
        EngineArgs(model=str(tiny.path), quantization="awq").create_engine_config()
    with pytest.raises(ValueError, match="is not one .*pass the .gguf file"):
        EngineArgs(model=str(tmp_path / "plain"), quantization="gguf").create_engine_config()
    with pytest.raises(ValueError, match="--dtype bfloat16"):
        EngineArgs(model=str(tiny.path), quantization="gguf", dtype="bfloat16").create_engine_config()
    with pytest.raises(ValueError, match="--enable-lora"):
        EngineArgs(model=str(tiny.path), quantization="gguf", enable_lora=True).create_engine_config()
    config = EngineArgs(model=str(tiny.path), quantization="gguf").create_engine_config()
    assert config.model_config.quantization == "gguf"
    assert config.model_config.quantized_from == str(tiny.path.resolve())
