"""``--quantization gguf``: a GGUF file's Q8_0 / Q4_1 matrices kept quantized and run by the
CPU kernels, against ``transformers`` holding the same (dequantized) values with float32
activations, and against the float32 route with int8 activations."""

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
from tests.model_loader.tiny_gguf import int8_route_reference, write_tiny_llama_gguf


# The CPU platform's op implementations (also on a GPU host), kernels loaded.
pytestmark = pytest.mark.usefixtures("ops_on_cpu")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(7, 64), (96, 160), (130, 1024)], ids=str)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_gguf_linear_is_the_dequantized_linear(qtype, shape, bias):
    """The layer's weight is gguf's own dequantization, exactly, and with float32
    activations its output ``F.linear`` over it at every row count (the kernel up to
    KERNEL_MAX_ROWS, torch after)."""
    n, k = shape
    rng = np.random.default_rng(n * k)
    stored = quantize(rng.standard_normal((n, k)).astype(np.float32), gguf.GGMLQuantizationType[qtype])
    reference = torch.from_numpy(dequantize(stored, gguf.GGMLQuantizationType[qtype]).reshape(n, k).copy())
    b = torch.from_numpy(rng.standard_normal(n).astype(np.float32)) if bias else None
    layer = GGUFLinear(qtype, stored, k, b, activations="float32")
    assert torch.equal(layer.weight, reference)
    for rows in (1, 2, 3, 4, 5, 9, KERNEL_MAX_ROWS, KERNEL_MAX_ROWS + 1):
        x = torch.randn(rows, k)
        torch.testing.assert_close(layer(x), F.linear(x, reference, b), rtol=1e-5, atol=1e-4)
    x = torch.randn(2, 3, k)  # leading dimensions kept, strided rows read in place
    torch.testing.assert_close(layer(x), F.linear(x, reference, b), rtol=1e-5, atol=1e-4)
    wide = torch.randn(3, 2 * k)
    torch.testing.assert_close(layer(wide[:, :k]), F.linear(wide[:, :k], reference, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape", [(7, 64), (130, 1024)], ids=str)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_gguf_linear_int8_activations(qtype, shape):
    """The int8 route rounds each block of 32 activations to int8: its output is the
    reference's for those rounded values at every kernel row count, within ~1-2 % of the
    float32 route's, and past KERNEL_MAX_ROWS (torch over the dequantized weight) exact."""
    n, k = shape
    rng = np.random.default_rng(n + k)
    stored = quantize(rng.standard_normal((n, k)).astype(np.float32), gguf.GGMLQuantizationType[qtype])
    b = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    layer, exact = GGUFLinear(qtype, stored, k, b, activations="int8"), GGUFLinear(qtype, stored, k, b, activations="float32")
    gen = torch.Generator().manual_seed(k)
    for rows in (1, 3, 4, 9, KERNEL_MAX_ROWS):
        x = torch.randn(rows, k, generator=gen) * torch.rand(rows, 1, generator=gen) * 10  # rows of several sizes
        x[0, :32] = 0.0  # an all-zero block (scale 0)
        got, want = layer(x), int8_route_reference(x, stored, qtype, k) + b
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4 * want.abs().max().item())
        full = exact(x) - b
        assert ((got - b - full).norm() / full.norm()).item() < 0.025
    x = torch.randn(KERNEL_MAX_ROWS + 1, k, generator=gen)
    torch.testing.assert_close(layer(x), exact(x), rtol=0, atol=0)
    x = torch.randn(2, 3, 2 * k, generator=gen)[..., :k]  # leading dimensions kept, strided rows read in place
    torch.testing.assert_close(layer(x), int8_route_reference(x, stored, qtype, k).view(2, 3, n) + b,
                               rtol=1e-5, atol=1e-3)


def test_gguf_activations_setting(monkeypatch):
    """Unset (``auto``): int8 where the kernels are built for AVX2 or for AVX-512 on AMD's
    cores, float32 on Intel's AVX-512 and for the plain loops; a value is read case-blind,
    and anything else is refused, naming what it takes."""
    from forkless import cpu_kernels
    from forkless.models.layers.gguf_linear import auto_activations

    assert [auto_activations(isa, vendor) for isa in ("avx512", "avx2", "portable")
            for vendor in ("GenuineIntel", "AuthenticAMD")] == ["float32", "int8", "int8", "int8", "float32", "float32"]
    stored = quantize(np.ones((4, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q4_1)
    monkeypatch.delenv("FORKLESS_GGUF_ACTIVATIONS", raising=False)
    assert GGUFLinear("Q4_1", stored, 64).activations == auto_activations(cpu_kernels.load().isa)
    for level in cpu_kernels.supported_isas():
        assert GGUFLinear("Q4_1", stored, 64, lib=cpu_kernels.load_isa(level)).activations == auto_activations(level)
    monkeypatch.setenv("FORKLESS_GGUF_ACTIVATIONS", "Float32")
    assert GGUFLinear("Q4_1", stored, 64).activations == "float32"
    monkeypatch.setenv("FORKLESS_GGUF_ACTIVATIONS", "INT8")
    assert GGUFLinear("Q4_1", stored, 64).activations == "int8"
    monkeypatch.setenv("FORKLESS_GGUF_ACTIVATIONS", "int4")
    with pytest.raises(ValueError, match=r"'int4' \(FORKLESS_GGUF_ACTIVATIONS\): expected one of auto, int8, float32"):
        GGUFLinear("Q4_1", stored, 64)


def test_gguf_linear_names_what_it_takes():
    stored = quantize(np.ones((4, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    with pytest.raises(ValueError, match="Q8_0 or Q4_1 weights, got Q4_0"):
        GGUFLinear("Q4_0", stored, 64)
    with pytest.raises(ValueError, match="do not hold 96 weights"):
        GGUFLinear("Q8_0", stored, 96)
    with pytest.raises(ValueError, match="takes float32 CPU input"):
        GGUFLinear("Q8_0", stored, 64)(torch.ones(1, 64, dtype=torch.bfloat16))


def _quantized_model(tiny_path: Path, folder: Path, stack: str = "1", activations: str = "float32"):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORKLESS_CPU_DECODE_STACK", stack)
        mp.setenv("FORKLESS_GGUF_ACTIVATIONS", activations)
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
    one-call decode stack) give ``transformers``' logits over the dequantized weights
    (float32 activations)."""
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


@pytest.mark.parametrize("activations", ["int8", "float32"])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_decode_stack_takes_quantized_layers_bit_for_bit(tmp_path, qtype, activations):
    tiny = write_tiny_llama_gguf(tmp_path / "m.gguf", gguf.GGMLQuantizationType[qtype])
    folder = convert_gguf_to_hf(tiny.path, tmp_path / "hf")
    runs = []
    for stack in ("1", "0"):
        model, _ = _quantized_model(tiny.path, folder, stack, activations)
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


def test_int8_activations_keep_the_default_models_predictions(smollm2_folder):
    """The quality check of the default route on real weights: the default model's own
    Q4_1 / Q8_0 file over an English paragraph, teacher-forced (a prefill step, then decode
    steps, each through the decode stack), int8 against float32 activations: the next-token
    distributions within 0.01 nats of KL divergence on average (measured ~0.003), the top
    token the same at >= 95 % of positions (measured ~97 %)."""
    from transformers import AutoTokenizer

    from forkless.model_loader.default_model import default_gguf_path

    text = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
            "movable metal type, oil-based ink and a wooden press adapted from those used to make wine. Within fifty "
            "years, presses had spread to more than two hundred cities across Europe, and the cost of books fell.")
    ids = AutoTokenizer.from_pretrained(smollm2_folder)(text)["input_ids"]
    logits = {}
    for activations in ("float32", "int8"):
        model, count = _quantized_model(default_gguf_path(), smollm2_folder, activations=activations)
        assert count == 4 * model.config.num_hidden_layers + 1
        harness = PagedHarness(model, get_attention_backend("cpu"), block_size=16, num_blocks=16)
        rows = [harness.step([("a", ids[:40])])[0]]
        rows += [harness.step([("a", [t])])[0] for t in ids[40:]]
        logits[activations] = torch.cat(rows).log_softmax(-1)
    exact, rounded = logits["float32"], logits["int8"]
    kl = (exact.exp() * (exact - rounded)).sum(-1)
    agree = (exact.argmax(-1) == rounded.argmax(-1)).float().mean().item()
    assert kl.mean().item() < 0.01 and agree >= 0.95, (kl.mean().item(), kl.max().item(), agree)


def test_engine_serves_the_gguf_quantized(tmp_path, monkeypatch):
    """Through the engine: greedy tokens as ``transformers`` generates them over the
    dequantized weights (float32 activations)."""
    monkeypatch.setenv("FORKLESS_GGUF_ACTIVATIONS", "float32")
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
