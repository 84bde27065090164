"""The C kernels of CPU workers: decode attention over the paged cache, packed linear layers,
the fused layer ops."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from forkless import cpu_kernels
from forkless.attention import AttentionMetadata, get_attention_backend
from forkless.models.layers.activation import SiluAndMul
from forkless.models.layers.cpu_linear import (OneDNNLinear, PackedLinear, PackedLinearBF16, bf16_linear_kind,
                                               cpu_linear_dtype_supported, cpu_linear_for, onednn_bf16_available,
                                               pack_linear_layers, use_cpu_linear)
from forkless.models.layers.norm import RMSNorm
from forkless.models.layers.rotary import RotaryEmbedding


@pytest.fixture(autouse=True)
def _kernels_built():
    assert cpu_kernels.load() is not None, "the CPU kernels did not build (see the log)"


@pytest.fixture
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _paged_step(hq: int, hkv: int, d: int, bs: int, seqs: list[tuple[int, int]], seed: int = 0):
    """A random cache with scattered blocks and one step in which sequence i, holding
    ``seqs[i][0]`` cached tokens, adds ``seqs[i][1]`` new ones (1: a decode)."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-(ctx + n) // bs) for ctx, n in seqs) + 3
    cache = torch.randn(get_attention_backend("torch").get_kv_cache_shape(num_blocks, bs, hkv, d), generator=gen)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots, starts, seq_lens = [], [], [0], []
    for ctx, n in seqs:
        table = [free.pop() for _ in range(-(-(ctx + n) // bs))]
        tables.append(table)
        slots += [table[p // bs] * bs + p % bs for p in range(ctx, ctx + n)]
        starts.append(starts[-1] + n)
        seq_lens.append(ctx + n)
    width = max(len(t) for t in tables)
    md = lambda: AttentionMetadata(  # noqa: E731 - each backend plans its own copy
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_query_len=max(n for _, n in seqs),
        max_seq_len=max(seq_lens),
        block_size=bs,
    )
    t = starts[-1]
    q, k, v = (torch.randn(t, h, d, generator=gen) for h in (hq, hkv, hkv))
    return cache, md, q, k, v


def _decode_step(hq: int, hkv: int, d: int, bs: int, lens: list[int], prefill: int, seed: int = 0):
    """A cache with scattered blocks, one decode token per ``lens`` entry, then maybe a prefill."""
    seqs = [(n - 1, 1) for n in lens] + ([(0, prefill)] if prefill else [])
    return _paged_step(hq, hkv, d, bs, seqs, seed)


@pytest.mark.parametrize(
    "hq,hkv,d,bs",
    [
        (9, 3, 64, 16),  # SmolLM2-135M
        (4, 4, 64, 16),  # multi-head (G = 1)
        (16, 2, 128, 16),  # G = 8, the largest register-tiled group
        (12, 1, 32, 4),  # G = 12: the generic path
        (6, 2, 20, 4),  # head_dim not a multiple of 8: the scalar tails
    ],
)
@pytest.mark.parametrize("prefill", [0, 7])
def test_decode_kernel_matches_reference(hq, hkv, d, bs, prefill):
    lens = [1, 2, 5, bs, bs + 1, 3 * bs + 5, 257, 40]
    cache, md, q, k, v = _decode_step(hq, hkv, d, bs, lens, prefill)
    ref_cache, cpu_cache = cache.clone(), cache.clone()
    scale = d**-0.5
    ref = get_attention_backend("torch")(hq, hkv, d, scale).forward(q, k, v, ref_cache, md())
    out = get_attention_backend("cpu")(hq, hkv, d, scale).forward(q, k, v, cpu_cache, md())
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cpu_cache, ref_cache, rtol=0, atol=0)  # the new keys are stored


@pytest.mark.parametrize("threads", [2], indirect=True)
def test_decode_kernel_threads_agree(threads):
    cache, md, q, k, v = _decode_step(9, 3, 64, 16, [30 + 17 * i for i in range(12)], 0)
    backend = get_attention_backend("cpu")(9, 3, 64, 0.125)
    parallel = backend.forward(q, k, v, cache, md())
    torch.set_num_threads(1)
    serial = backend.forward(q, k, v, cache, md())
    torch.testing.assert_close(parallel, serial, rtol=0, atol=0)


@pytest.mark.parametrize("threads", [2, 3], indirect=True)
@pytest.mark.parametrize("lens", [[700], [16 * 8], [16 * 8 + 1], [63], [900, 5]], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_splits_few_sequences_over_threads(threads, lens, dtype):
    """Fewer sequences than threads: each sequence's blocks are attended in parts, one per
    thread, and merged; the result is the reference's (and the single thread's, to float
    rounding)."""
    cache, md, q, k, v = _decode_step(9, 3, 64, 16, lens, 0)
    cache = cache.to(dtype)
    scale = 0.125
    ref = get_attention_backend("torch")(9, 3, 64, scale).forward(q, k, v, cache.float().clone(), md())
    backend = get_attention_backend("cpu")(9, 3, 64, scale)
    split = backend.forward(q.to(dtype), k.to(dtype), v.to(dtype), cache.clone(), md()).float()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(split, ref, rtol=tol, atol=tol)
    torch.set_num_threads(1)
    whole = backend.forward(q.to(dtype), k.to(dtype), v.to(dtype), cache.clone(), md()).float()
    torch.testing.assert_close(split, whole, rtol=tol, atol=tol)


def _compare_with_reference(hq, hkv, d, bs, seqs, seed=0, dtype=torch.float32):
    """The cpu backend against the torch reference on one step; returns the cpu plan. In
    bfloat16 the reference runs in float32 on the same (bfloat16) values, and the kernels'
    output, rounded to bfloat16 once, must be within that rounding of it."""
    cache, md, q, k, v = (t.to(dtype) if isinstance(t, torch.Tensor) else t for t in _paged_step(hq, hkv, d, bs,
                                                                                                 seqs, seed))
    ref_cache, cpu_cache = cache.float(), cache.clone()
    scale = d**-0.5
    ref = get_attention_backend("torch")(hq, hkv, d, scale).forward(q.float(), k.float(), v.float(), ref_cache, md())
    cpu_md = md()
    out = get_attention_backend("cpu")(hq, hkv, d, scale).forward(q, k, v, cpu_cache, cpu_md)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(cpu_cache.float(), ref_cache, rtol=0, atol=0)
    return cpu_md.backend_state["cpu"]


@pytest.mark.parametrize(
    "hq,hkv,d,bs",
    [
        (9, 3, 64, 16),  # SmolLM2-135M
        (4, 4, 64, 16),  # multi-head (G = 1): 144 tokens a tile
        (16, 2, 128, 16),  # G = 8
        (10, 2, 80, 5),  # head_dim 80, blocks of 5
        (12, 1, 32, 4),  # G = 12
        (6, 2, 20, 4),  # head_dim not a multiple of 4: the partial output tiles
        (9, 3, 64, 1),  # one token a block
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_kernel_matches_reference(hq, hkv, d, bs, dtype):
    # (cached tokens, new tokens): decodes, fresh prefills and chunks over cached context,
    # starting and ending mid-block, one or several query tiles, short and long contexts.
    seqs = [(7, 1), (0, 9), (1, 2), (max(bs - 1, 1), 3), (3 * bs + 5, 40), (300, 1), (2, 25), (0, 1), (613, 170),
            (1500, 4)]
    kp = _compare_with_reference(hq, hkv, d, bs, seqs, dtype=dtype)
    # Every prefill ran in the kernel -- the fresh prompts and the chunks over cached
    # context alike --, none through SDPA (gathered or not); the decodes in theirs.
    assert kp.plan.context_ids == [1, 2, 3, 4, 6, 7, 8, 9]
    assert kp.plan.decode_ids == [0, 5]
    assert not kp.plan.prefills


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("seqs", [
    [(3000, 4)],  # few tiles, long context: with 2 threads split into ranges and merged
    [(2000, 2), (5, 1), (900, 300), (0, 30)],
    [(4000, 64), (700, 16)],
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_kernel_threads_match_reference(threads, seqs, dtype):
    _compare_with_reference(9, 3, 64, 16, seqs, seed=threads, dtype=dtype)


def test_prefill_kernel_is_causal_within_the_chunk():
    """Later new tokens' keys must not reach earlier rows: change the last new token's key
    and value, and only the last row's output may move."""
    cache, md, q, k, v = _paged_step(9, 3, 64, 16, [(40, 20)])
    backend = get_attention_backend("cpu")(9, 3, 64, 0.125)
    before = backend.forward(q, k, v, cache.clone(), md())
    k2, v2 = k.clone(), v.clone()
    k2[-1] += 5.0
    v2[-1] -= 3.0
    after = backend.forward(q, k2, v2, cache.clone(), md())
    torch.testing.assert_close(after[:-1], before[:-1], rtol=0, atol=0)
    assert (after[-1] - before[-1]).abs().max() > 1e-2


@pytest.mark.parametrize("out_features,in_features", [(24, 8), (50, 13), (96, 576), (7, 1)])
@pytest.mark.parametrize("rows", [0, 1, 3, 4, 5, 130])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_linear(out_features, in_features, rows, bias):
    torch.manual_seed(rows)
    linear = torch.nn.Linear(in_features, out_features, bias=bias)
    packed = PackedLinear.from_linear(linear)
    assert torch.equal(packed.weight, linear.weight)  # packing loses nothing
    x = torch.randn(rows, in_features)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_packed_linear_strided_and_batched_input(threads):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 200)
    packed = PackedLinear.from_linear(linear)
    wide = torch.randn(300, 100)
    x = wide[:, 10:74]  # rows 100 floats apart
    torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
    x3 = torch.randn(2, 3, 64)
    assert packed(x3).shape == (2, 3, 200)
    torch.testing.assert_close(packed(x3), F.linear(x3, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


# 1 row (four panels at a time, each thread its own run of panels) and 2-32 rows (decode
# and speculative verification steps: each panel read as several streams, the rows in
# blocks taking turns on each slab; in = 1030 and 7 leave a remainder of rows, 7 is fewer
# rows than streams), at every level this CPU has, on one thread and with the panels split
# over two, from rows 1030 + 5 floats apart, with a bias.
@pytest.mark.parametrize("level", [level for level in cpu_kernels.ISA_LEVELS if level in cpu_kernels.supported_isas()])
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_packed_linear_few_rows_match_linear(level, threads):
    lib = cpu_kernels.load_isa(level)
    assert lib is not None, f"the {level} CPU kernels did not build (see the log)"
    torch.manual_seed(0)
    for out_features, in_features in ((4100, 1030), (200, 576), (70, 7)):
        linear = torch.nn.Linear(in_features, out_features)
        packed = PackedLinear(linear.weight, linear.bias, lib=lib)
        wide = torch.randn(33, in_features + 5)
        for rows in (1, *range(2, 9), 12, 31, 32, 33):
            x = wide[:rows, 3: 3 + in_features]
            torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


def test_packed_linear_rejects_other_dtypes():
    with pytest.raises(ValueError, match="float32"):
        PackedLinear(torch.zeros(4, 4, dtype=torch.bfloat16))
    packed = PackedLinear(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="float32"):
        packed(torch.zeros(1, 4, dtype=torch.float64))


def test_pack_linear_layers_replaces_only_linears():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Sequential(torch.nn.Linear(16, 4)))
    x = torch.randn(5, 8)
    expected = model(x)
    assert pack_linear_layers(model) == 2
    assert isinstance(model[0], PackedLinear) and isinstance(model[2][0], PackedLinear)
    torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


def test_pack_linear_layers_packs_in_place_only_what_the_model_does_not_share():
    torch.manual_seed(0)
    # 3,072 x 576 floats is several of the in-place pass's 4 MiB chunks, the last one partial.
    own, tied, padded = torch.nn.Linear(576, 3072), torch.nn.Linear(64, 48, bias=False), torch.nn.Linear(16, 50)
    twin = torch.nn.Linear(64, 48, bias=False)
    twin.weight = tied.weight  # one Parameter in two modules (a tied weight)
    model = torch.nn.ModuleList([own, tied, twin, padded])
    inputs = [torch.randn(5, 576), torch.randn(5, 64), torch.randn(5, 64), torch.randn(5, 16)]
    with torch.inference_mode():
        expected = [layer(x) for layer, x in zip(model, inputs)]
    weights = {name: model[i].weight for i, name in enumerate(("own", "tied", "twin", "padded"))}
    tied_values = tied.weight.detach().clone()
    assert pack_linear_layers(model) == 4
    assert model[0].packed.data_ptr() == weights["own"].data_ptr()  # no second copy
    assert torch.equal(weights["tied"], tied_values)  # the shared weight kept its values
    assert model[1].packed.data_ptr() != weights["tied"].data_ptr()
    with torch.inference_mode():
        for layer, x, want in zip(model, inputs, expected):
            torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)
    # Packed in place or into a new tensor: the same layout.
    w = torch.randn(24 * 41, 40)
    assert torch.equal(PackedLinear(w.clone(), consume=True).packed, PackedLinear(w).packed)
    assert torch.equal(PackedLinear._pack_in_place(w.clone(), 24, chunk_bytes=3 * 24 * 40 * 4), PackedLinear._pack(w, 24))
    wb = torch.randn(32 * 5, 20).to(torch.bfloat16)
    assert torch.equal(PackedLinearBF16._pack_in_place(wb.clone(), 32, chunk_bytes=2 * 32 * 20 * 2),
                       PackedLinearBF16._pack(wb, 32))


# oneDNN runs bfloat16 on AVX512-BF16 / AMX (or AVX-512, emulated); on an AVX2-only CPU
# it does not, and bfloat16 layers stay nn.Linear (the test after these checks that).
needs_onednn_bf16 = pytest.mark.skipif(not onednn_bf16_available(),
                                       reason="this CPU or torch build has no oneDNN bfloat16 matmul")


@needs_onednn_bf16
@pytest.mark.parametrize("rows", [0, 1, 5, 33, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_matches_linear_in_bfloat16(rows, bias):
    _check_bf16_linear(OneDNNLinear, rows, bias)


@pytest.mark.parametrize("isa", cpu_kernels.supported_isas())
@pytest.mark.parametrize("rows", [0, 1, 5, 7, 33, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_bf16_linear_matches_linear_in_bfloat16(rows, bias, isa):
    """forkless's bfloat16 kernel at every ISA level this CPU has (AVX512-BF16 tiles where
    the build has them, plain loops otherwise), row counts across its 6-row tiles."""
    _check_bf16_linear(lambda w, b: PackedLinearBF16(w, b, lib=cpu_kernels.load_isa(isa)), rows, bias)


def _check_bf16_linear(make, rows: int, bias: bool) -> None:
    torch.manual_seed(rows)
    linear = torch.nn.Linear(576, 200, bias=bias).bfloat16()
    packed = make(linear.weight, linear.bias)
    if isinstance(packed, PackedLinearBF16):
        assert torch.equal(packed.weight, linear.weight)  # the packing loses nothing
    x = torch.randn(2, rows, 576).bfloat16()
    with torch.inference_mode():
        out = packed(x)
        assert out.shape == (2, rows, 200) and out.dtype == torch.bfloat16
        # Float32 sums rounded once, as F.linear's; only their order may differ.
        torch.testing.assert_close(out, F.linear(x, linear.weight, linear.bias), rtol=1.6e-2, atol=1e-2)
        wide = torch.randn(rows, 600).bfloat16()
        torch.testing.assert_close(packed(wide[:, 10:586]), F.linear(wide[:, 10:586], linear.weight, linear.bias),
                                   rtol=1.6e-2, atol=1e-2)
    with pytest.raises(ValueError, match="bfloat16 CPU input, got torch.float32"):
        packed(torch.zeros(1, 576))


def test_cpu_linear_for_picks_by_dtype_and_names_the_bad_one(monkeypatch):
    assert isinstance(cpu_linear_for(torch.zeros(4, 4)), PackedLinear)
    with pytest.raises(ValueError, match="torch.float16 weights: expected float32 or bfloat16"):
        cpu_linear_for(torch.zeros(4, 4, dtype=torch.float16))
    assert not cpu_linear_dtype_supported(torch.float16)
    # bfloat16: forkless's kernel by default where the CPU has AVX512-BF16 and no AMX.
    flags = cpu_kernels.cpu_flags()
    native = "avx512_bf16" in flags and "amx_bf16" not in flags and cpu_kernels.isa() == "avx512"
    assert bf16_linear_kind() == ("kernels" if native else "onednn" if onednn_bf16_available() else None)
    assert cpu_linear_dtype_supported(torch.bfloat16) == (bf16_linear_kind() is not None)
    monkeypatch.setenv("FORKLESS_CPU_BF16_LINEAR", "kernels")
    assert isinstance(cpu_linear_for(torch.zeros(4, 6, dtype=torch.bfloat16)), PackedLinearBF16)
    # An odd in_features: the kernel takes K in pairs, oneDNN takes it (where it runs).
    if onednn_bf16_available():
        assert isinstance(cpu_linear_for(torch.zeros(4, 5, dtype=torch.bfloat16)), OneDNNLinear)
    with pytest.raises(ValueError, match="even in_features"):
        PackedLinearBF16(torch.zeros(4, 5, dtype=torch.bfloat16))
    monkeypatch.setenv("FORKLESS_CPU_BF16_LINEAR", "mkl")
    with pytest.raises(ValueError, match="FORKLESS_CPU_BF16_LINEAR='mkl': expected one of auto, kernels, onednn"):
        cpu_linear_for(torch.zeros(4, 4, dtype=torch.bfloat16))


def _tiny_llama(tmp_path, dtype: torch.dtype):
    from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

    from forkless.model_loader import load_model

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         attention_bias=True, initializer_range=0.2)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    backend = get_attention_backend("cpu")
    return load_model(tmp_path, AutoConfig.from_pretrained(tmp_path), dtype, "cpu", backend), backend


@pytest.mark.parametrize("kind", ["kernels", "onednn"])
def test_bfloat16_model_runs_its_linear_layers_packed(tmp_path, kind, monkeypatch):
    """A bfloat16 model on the CPU: every linear layer and the tied head packed for the
    layer FORKLESS_CPU_BF16_LINEAR names (forkless's kernel on any CPU; oneDNN where the CPU
    has it, and left as nn.Linear where not), the logits of a prefill and a decode step as
    the unpacked model's."""
    from paged_harness import PagedHarness

    monkeypatch.setenv("FORKLESS_CPU_BF16_LINEAR", kind)
    if kind == "onednn" and not onednn_bf16_available():
        with pytest.raises(ValueError, match="oneDNN has no bfloat16 matmul"):
            bf16_linear_kind()
        monkeypatch.setenv("FORKLESS_CPU_BF16_LINEAR", "auto")  # then auto leaves nn.Linear where no kernel wins
    layer_type = PackedLinearBF16 if kind == "kernels" else OneDNNLinear
    model, backend = _tiny_llama(tmp_path, torch.bfloat16)
    reference, _ = _tiny_llama(tmp_path, torch.bfloat16)
    packed = use_cpu_linear(model, torch.device("cpu"), torch.bfloat16)
    assert packed == (bf16_linear_kind() is not None)
    linears = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, OneDNNLinear, PackedLinearBF16))]
    assert linears and all(isinstance(m, layer_type if packed else torch.nn.Linear) for m in linears)
    if packed:
        assert isinstance(model.lm_head, layer_type)  # its own copy: the embedding keeps its rows
        assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    seqs = [[3, 17, 99, 4, 250], [8, 8, 1]]
    runs = []
    with torch.inference_mode():
        for m in (model, reference):
            harness = PagedHarness(m, backend, block_size=4)
            first = harness.step([(f"s{i}", p) for i, p in enumerate(seqs)])
            second = harness.step([(f"s{i}", [int(out[-1].argmax())]) for i, out in enumerate(first)])
            runs.append([*first, *second])
    for got, want in zip(*runs):
        assert got.dtype == want.dtype == torch.bfloat16  # the model's dtype; the sampler casts
        torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)
    # The float32 model on the C kernels; float16 has no packed layer and stays as loaded.
    assert use_cpu_linear(_tiny_llama(tmp_path, torch.float32)[0], torch.device("cpu"), torch.float32)
    half, _ = _tiny_llama(tmp_path, torch.float16)
    assert not use_cpu_linear(half, torch.device("cpu"), torch.float16)
    assert isinstance(half.lm_head, torch.nn.Linear) or half.lm_head is half.model.embed_tokens


def _load_in_fresh_process(env: dict[str, str]) -> subprocess.CompletedProcess:
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout);"
        "from forkless import cpu_kernels; print('LOADED', cpu_kernels.load() is not None)"
    )
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FORKLESS_KERNEL_CACHE_DIR"}
    return {**env, **values}


def test_build_is_cached_in_the_cache_root(tmp_path):
    env = _env(FORKLESS_CACHE_ROOT=str(tmp_path))
    first = _load_in_fresh_process(env)
    assert "LOADED True" in first.stdout, first.stdout + first.stderr
    assert "compiled the CPU kernels" in first.stdout + first.stderr
    assert len(list((tmp_path / "kernels").glob("forkless_cpu-*.so"))) == 1
    second = _load_in_fresh_process(env)
    assert "LOADED True" in second.stdout
    assert "compiled" not in second.stdout + second.stderr  # reused, not rebuilt


def test_without_compiler_or_when_disabled_torch_ops_run(tmp_path):
    missing = _load_in_fresh_process(_env(FORKLESS_CACHE_ROOT=str(tmp_path), CC=str(tmp_path / "no-such-cc")))
    assert "LOADED False" in missing.stdout
    assert "no C compiler" in missing.stdout + missing.stderr
    off = _load_in_fresh_process(_env(FORKLESS_CPU_KERNELS="0"))
    assert "LOADED False" in off.stdout


def test_cpu_backend_without_kernels_is_the_reference(monkeypatch, caplog):
    cache, md, q, k, v = _decode_step(9, 3, 64, 16, [5, 40, 77], 6)
    ref = get_attention_backend("torch")(9, 3, 64, 0.125).forward(q, k, v, cache.clone(), md())
    monkeypatch.setattr(cpu_kernels, "load", lambda: None)
    with caplog.at_level(logging.WARNING):
        out = get_attention_backend("cpu")(9, 3, 64, 0.125).forward(q, k, v, cache.clone(), md())
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("rows", [1, 5, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_layer_ops_match_pytorch_layers(rows, threads, dtype, monkeypatch, ops_on_cpu):
    torch.manual_seed(rows)
    x = torch.randn(rows, 3 * 96, dtype=dtype)
    weight = torch.randn(96, dtype=dtype)
    residual = torch.randn(rows, 96, dtype=dtype)
    # Rotary on strided views of a fused qkv projection, as the models call it.
    positions = torch.randint(0, 500, (rows,))
    qkv = torch.randn(rows, (6 + 2 + 2) * 32, dtype=dtype)

    def run(implementation):
        # Each op picks its implementation when it is built.
        norm = RMSNorm(96, eps=1e-5, dtype=dtype)
        norm.weight.data.copy_(weight)
        act = SiluAndMul()
        rope = RotaryEmbedding(32, {"rope_type": "default", "rope_theta": 10000.0})
        assert {norm.implementation, act.implementation, rope.implementation} == {implementation}
        buf = qkv.clone()  # the fused rotary works in place
        q = buf[:, : 6 * 32].reshape(rows, 6, 32)
        k = buf[:, 6 * 32 : 8 * 32].reshape(rows, 2, 32)
        rq, rk = rope(positions, q, k)
        per_head = norm(x[:, :96].reshape(rows, 1, 96).expand(rows, 2, 96))
        return (norm(x[:, 96:192]), *norm(x[:, :96], residual), act(x[:, :192] * 4), rq, rk, per_head)

    fused = run("forward_cpu")
    monkeypatch.setenv("FORKLESS_FUSED_KERNELS", "0")
    plain = run("forward_native")
    for a, b in zip(fused, plain):
        assert a.dtype == b.dtype == dtype
        if dtype == torch.float32:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        else:
            # Rounded where PyTorch rounds: equal but where a sum taken in another order or
            # exp's last float32 bit tips a rounding (SiLU's, then the product's: two
            # bfloat16 steps at most).
            torch.testing.assert_close(a, b, rtol=2 ** -6, atol=1e-6)
            assert (a == b).float().mean() > 0.99


def test_silu_and_mul_saturates_like_pytorch(monkeypatch, ops_on_cpu):
    x = torch.tensor([[-200.0, -90.0, -20.0, -1e-3, 0.0, 3.0, 90.0, 200.0] * 2 + [1.0] * 16])
    fused = SiluAndMul()
    monkeypatch.setenv("FORKLESS_FUSED_KERNELS", "0")
    plain = SiluAndMul()
    assert (fused.implementation, plain.implementation) == ("forward_cpu", "forward_native")
    torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-6)
