"""The Triton LoRA shrink/expand kernels against the torch path, eager and in a CUDA graph,
and end to end: a mixed batch of base + adapters on CUDA (graphs on) equals each alone.

The kernel checks also run on the CPU under ``TRITON_INTERPRET=1`` when called directly
(``DEVICE`` falls back to the CPU; float32 only: the interpreter's bfloat16 ``tl.dot``
returns garbage); under pytest the GPU conftest skips this file where CUDA or Triton is
missing.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from forkless.lora.layers import LoRALinear, LoRAStepContext

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
MAX_LORAS = 4
# bfloat16: both paths round x @ A and the delta to bfloat16, but sum in other orders.
DTYPES = [(torch.float32, 1e-4), (torch.bfloat16, 6e-2)]


def _pair(in_features: int, widths: list[int], rank: int, dtype: torch.dtype, seed: int = 0):
    """The same base layer and adapter slots wrapped twice: torch path and Triton path."""
    g = torch.Generator().manual_seed(seed)
    base = nn.Linear(in_features, sum(widths), bias=False).to(DEVICE, dtype)
    with torch.no_grad():
        base.weight.copy_(torch.randn(sum(widths), in_features, generator=g) / in_features**0.5)
    ctx_t = LoRAStepContext(MAX_LORAS, DEVICE, "torch")
    ctx_k = LoRAStepContext(MAX_LORAS, DEVICE, "triton", max_tokens=512)
    layers = [LoRALinear(base, in_features, widths, MAX_LORAS, rank, ctx, dtype, DEVICE) for ctx in (ctx_t, ctx_k)]
    for slot in range(MAX_LORAS):
        _write_slot(layers, slot, in_features, widths, rank, g)
    return layers, ctx_t, ctx_k


def _write_slot(layers, slot, in_features, widths, rank, g, r=None):
    r = r or rank
    weights = []
    for i, w in enumerate(widths):
        if slot == 1 and i == 1:
            weights.append(None)  # an adapter that leaves one stacked projection alone
            continue
        a = torch.randn(r, in_features, generator=g) / in_features**0.5
        b = torch.randn(w, r, generator=g) * 0.5
        weights.append((a, b))
    for layer in layers:
        dtype = layer.lora_a.dtype
        layer.set_slot(slot, [None if p is None else (p[0].to(DEVICE, dtype), p[1].to(DEVICE, dtype))
                              for p in weights])


def _slots(num_tokens: int, seed: int) -> np.ndarray:
    rng = np.random.RandomState(seed)
    return rng.randint(-1, MAX_LORAS, size=num_tokens).astype(np.int64)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_tokens", [1, 7, 64, 300])
# The last one: column blocks straddle two and three stacked projections.
@pytest.mark.parametrize("shape", [(1024, [2048, 1024, 1024], 16), (3072, [1024], 8), (256, [512, 512], 64),
                                   (96, [80, 48, 40], 8)],
                         ids=["qkv-r16", "down-r8", "gateup-r64", "odd-r8"])
def test_kernels_match_torch_eager(dtype, tol, num_tokens, shape):
    in_features, widths, rank = shape
    (lt, lk), ctx_t, ctx_k = _pair(in_features, widths, rank, dtype)
    x = torch.randn(num_tokens, in_features, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    token_slot = _slots(num_tokens, seed=num_tokens)
    for ctx in (ctx_t, ctx_k):
        ctx.set(token_slot, DEVICE)
    with torch.inference_mode():
        want, got = lt(x), lk(x)
    _close(got, want, tol)
    # Base-model tokens get the base layer: exactly where the base GEMM runs alone; a
    # folded step's GEMM has more output columns, and cuBLAS may sum in another order.
    base = torch.from_numpy(token_slot < 0).to(DEVICE)
    folded = num_tokens <= ctx_k.fold_max_tokens
    with torch.inference_mode():
        _close(got[base], lk.base(x)[base], tol if folded else 0.0)


def test_folded_layer_shares_the_base_weight():
    """A plain linear layer on the Triton path is folded: its weight and the slots' shrink
    weights are rows of one tensor (no copy of either), and writing a slot leaves the base
    rows alone."""
    (lt, lk), _, _ = _pair(256, [128, 64], 16, torch.float32)
    assert lk.w_ext is not None and lt.w_ext is None
    base_w = lk.base.weight
    assert base_w.data_ptr() == lk.w_ext.data_ptr() and base_w.shape == (192, 256)
    assert lk.lora_a.shape == (MAX_LORAS, 256, 32)
    assert lk.lora_a.untyped_storage().data_ptr() == lk.w_ext.untyped_storage().data_ptr()
    before = base_w.detach().clone()
    _write_slot([lk], 2, 256, [128, 64], 16, torch.Generator().manual_seed(9))
    assert torch.equal(lk.base.weight, before)
    kept = [0, 1, 3]
    torch.testing.assert_close(lk.lora_a[kept], lt.lora_a[kept], rtol=0, atol=0)
    assert not torch.equal(lk.lora_a[2], lt.lora_a[2])


def test_kernels_no_adapter_token_is_base():
    (lt, lk), ctx_t, ctx_k = _pair(256, [256], 16, torch.float32)
    x = torch.randn(9, 256).to(DEVICE)
    ctx_k.set(_slots(9, 0), DEVICE)
    ctx_k.set(np.full(9, -1), DEVICE)  # a base-only step after an adapter step
    assert not ctx_k.active
    with torch.inference_mode():
        _close(lk(x), lk.base(x), 0.0)
        ctx_k.capturing = True  # kernels launched with every segment empty: still the base
        _close(lk(x), lk.base(x), 0.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype,tol", DTYPES, ids=["fp32", "bf16"])
def test_kernels_in_cuda_graph(dtype, tol):
    """One capture with empty segments; replays with other adapter mixes and rewritten slots."""
    in_features, widths, rank, batch = 1024, [2048, 1024, 1024], 16, 32
    (lt, lk), ctx_t, ctx_k = _pair(in_features, widths, rank, dtype)
    x_static = torch.zeros(batch, in_features, dtype=dtype, device=DEVICE)
    with torch.inference_mode():
        ctx_k.clear()
        ctx_k.capturing = True
        lk(x_static)  # warm-up: compile
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = lk(x_static)
        ctx_k.capturing = False
        g = torch.Generator().manual_seed(5)
        for step in range(4):
            if step == 2:  # swap adapters into slots 0 and 3: weights change in place
                _write_slot([lt, lk], 0, in_features, widths, rank, g)
                _write_slot([lt, lk], 3, in_features, widths, rank, g, r=4)
            token_slot = _slots(batch, seed=100 + step)
            if step == 3:
                token_slot[:] = -1  # a base-only step replays the same graph
            x_static.copy_(torch.randn(batch, in_features, generator=g).to(DEVICE, dtype))
            ctx_t.set(token_slot, DEVICE)
            if step == 1:  # 20 real tokens: the graph's 12 padding rows get the base layer
                token_slot[20:] = -1
                ctx_t.set(token_slot, DEVICE)
                ctx_k.set(token_slot[:20], DEVICE)
            else:
                ctx_k.set(token_slot, DEVICE)
            graph.replay()
            _close(out, lt(x_static), tol)


# ------------------------------------------------------------------ end to end


def _write_adapter(folder: Path, hf: dict, rank: int, seed: int) -> Path:
    """A PEFT LoRA folder on every projection, random weights large enough to change greedy text."""
    from safetensors.torch import save_file

    from forkless.lora.peft import llama_lora_shapes

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (fan_in, fan_out) in llama_lora_shapes(hf).items():
        key = f"base_model.model.{module}"
        tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) / fan_in**0.5
        tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * 0.05
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
         "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}))
    return folder


@pytest.fixture(scope="module")
def adapters(real_size_model, tmp_path_factory):
    from forkless.lora import LoRARequest

    hf = json.loads((Path(real_size_model) / "config.json").read_text())
    root = tmp_path_factory.mktemp("lora-gpu")
    return [LoRARequest(f"a{i}", i + 1, str(_write_adapter(root / f"a{i}", hf, 16, seed=i))) for i in range(5)]


def _run(model, batches, **engine_args) -> list[list[list[int]]]:
    """Greedy outputs of each batch (a list of (prompt, adapter or None)) on one engine."""
    from forkless import LLM, SamplingParams

    llm = LLM(str(model), dtype="float32", max_model_len=256, kv_cache_memory=1 << 30,
              max_num_batched_tokens=128, max_num_seqs=16, enable_lora=True, max_loras=3,
              max_lora_rank=16, max_cpu_loras=5, **engine_args)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        results = []
        for batch in batches:
            outs = llm.generate([{"prompt_token_ids": p} for p, _ in batch], params, use_tqdm=False,
                                lora_request=[lora for _, lora in batch])
            results.append([list(o.outputs[0].token_ids) for o in outs])
        return results
    finally:
        llm.shutdown()


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(100, 151936) for _ in range(rng.randint(5, 60))] for _ in range(n)]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_mixed_batch_equals_alone_on_cuda(real_size_model, adapters, async_scheduling):
    """Base + 3 adapters in one batch (graph decode, Triton kernels) give each request what
    it gets alone; then other adapters swap into the slots without recapture."""
    prompts = _prompts(8)
    first = [None, adapters[0], adapters[1], adapters[2]] * 2
    second = [adapters[3], None, adapters[4], adapters[0]] * 2  # swaps: max_loras is 3
    mixed1 = list(zip(prompts, first))
    mixed2 = list(zip(prompts, second))
    alone = [[pair] for pair in mixed1 + mixed2]
    out = _run(real_size_model, [mixed1, mixed2, *alone], async_scheduling=async_scheduling)
    got = out[0] + out[1]
    want = [o[0] for o in out[2:]]
    assert got == want
    # The adapters change the text (the LoRA path is not a no-op): the same prompt on the
    # base model and on an adapter, and on two adapters, differ.
    assert got[0] != got[8] and got[1] != got[9] and got[2] != got[10]


def test_triton_path_equals_torch_path(real_size_model, adapters, monkeypatch):
    """The engine with graphs + Triton kernels equals the eager torch LoRA path."""
    from forkless.lora import layers

    prompts = _prompts(8)
    batch = list(zip(prompts, [None, adapters[0], adapters[1], adapters[2]] * 2))
    got = _run(real_size_model, [batch])
    monkeypatch.setattr(layers, "triton_available", lambda: False)  # torch path, graphs off
    want = _run(real_size_model, [batch])
    assert got == want
