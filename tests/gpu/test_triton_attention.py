"""The Triton paged backend against the torch reference, kernel level, on the GPU.

Every decode launch the backend can choose (KV heads per program, tile, splits) and the
fp8 cache (keys/values rounded to e4m3 with per-tensor scales) must give the reference's
output on prefill, prefill over cached context, mixed steps and decode.
"""

from __future__ import annotations

import pytest
import torch

from forkless.attention import AttentionMetadata, get_attention_backend

# The backend module imports Triton; CI has neither a GPU nor (necessarily) Triton.
_paged = pytest.importorskip("forkless.attention.backends.triton_paged",
                             reason="needs Triton (the paged GPU attention backend); not installed")
DecodeLaunch, PrefillLaunch = _paged.DecodeLaunch, _paged.PrefillLaunch

HQ, HKV, D, BS, NUM_BLOCKS = 16, 8, 128, 16, 256


def _steps():
    # (sequence, new tokens): prefill, prefill on top of context, mixed, decode.
    return [
        [("a", 37), ("b", 5)],
        [("a", 1), ("b", 1)],
        [("a", 20), ("b", 1), ("c", 300)],
        [("a", 1), ("b", 1), ("c", 1)],
    ]


# Launches that fit a float32 tile in shared memory (a first H200 run found
# kv_per_prog=8 with 32-token tiles and 3 stages over the limit in float32).
LAUNCHES = [
    None,  # the backend's own choice
    DecodeLaunch(kv_per_prog=1, block_n=64),
    DecodeLaunch(kv_per_prog=2, block_n=32, num_warps=8),
    DecodeLaunch(kv_per_prog=8, block_n=16, num_stages=2),
    DecodeLaunch(kv_per_prog=8, block_n=16, num_warps=8, num_stages=2, splits=3),
    DecodeLaunch(block_n=64, num_stages=2, splits=2, fp8_via_fp16=True),
    DecodeLaunch(kv_per_prog=2, block_n=32, num_stages=2, keys_first=True),
    DecodeLaunch(block_n=64, num_stages=2, heads_fast=True),
    DecodeLaunch(kv_per_prog=2, block_n=32, num_stages=2, splits=3, heads_fast=True),
    DecodeLaunch(block_n=64, num_stages=2, heads_fast=True, longest_first=True),
    DecodeLaunch(block_n=32, num_stages=2, splits=3, longest_first=True),
]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("splits", [None, 4])
@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda x: "auto" if x is None else
                         f"kv{x.kv_per_prog}-n{x.block_n}-w{x.num_warps}-s{x.num_stages}-sp{x.splits}"
                         f"{'-kfirst' if x.keys_first else ''}{'-hfast' if x.heads_fast else ''}{'-longest' if x.longest_first else ''}")
def test_matches_reference(dtype, tol, splits, launch):
    _check(dtype, tol, splits, launch)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
@pytest.mark.parametrize("splits", [None, 4])
@pytest.mark.parametrize("launch", [LAUNCHES[i] for i in (0, 2, 4, 5, 6)], ids=lambda x: "auto" if x is None
                         else f"kv{x.kv_per_prog}-fp16{x.fp8_via_fp16}-kfirst{x.keys_first}"
                         f"-sp{x.splits}")
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.5, 2.0)])
def test_fp8_cache_matches_reference(dtype, splits, launch, scales):
    """An fp8 cache stores e4m3(x / scale) and attends as the reference does over the
    dequantized keys/values (the rounding to fp8 is the only error it adds; the default
    launch, an fp8 dot, also rounds the queries: 4 %)."""
    _check(dtype, 4e-2 if launch is None else 2e-2 if dtype == torch.bfloat16 else 1e-5, splits, launch,
           kv_dtype=torch.float8_e4m3fn, scales=scales)



@pytest.mark.parametrize("splits", [None, 4])
@pytest.mark.parametrize("launch", [DecodeLaunch(block_n=64, num_stages=2, fp8_dot=True),
                                    DecodeLaunch(block_n=128, num_warps=8, num_stages=2, heads_fast=True, fp8_dot=True)],
                         ids=["n64", "n128-w8-hfast"])
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.5, 2.0)])
def test_fp8_dot_matches_reference(splits, launch, scales):
    """The scores as an fp8 dot (each query row rounded to e4m3 with its own scale) over
    an fp8 cache: within 4 % of the reference over the dequantized cache (relative L2;
    the fp8 cache alone is held to 2 %)."""
    _check(torch.bfloat16, 4e-2, splits, launch, kv_dtype=torch.float8_e4m3fn, scales=scales)

# Prefill launches: the two defaults (split causal for 16-bit heads of at most 128) and the
# candidates benchmarks/prefill_attention.py --sweep
# times (bf16 only: float32 tiles of 128 and more rows need more shared memory than a GPU has).
PREFILL_LAUNCHES = [_paged.PREFILL_DEFAULT, _paged.PREFILL_SPLIT, PrefillLaunch(128, 64, 8, 2), PrefillLaunch(128, 128, 8, 2),
                    PrefillLaunch(256, 64, 8, 2), PrefillLaunch(128, 32, 4, 3),
                    PrefillLaunch(64, 64, 4, 3, split_causal=True)]


@pytest.mark.parametrize("launch", PREFILL_LAUNCHES, ids=lambda x: f"r{x.rows}-n{x.block_n}-w{x.num_warps}-s{x.num_stages}{'-split' if x.split_causal else ''}")
def test_prefill_launches_match_reference(launch):
    """Every prefill launch attends as the reference on prefill, prefill over cached
    context and mixed steps (whose one-token rows it attends too); decode steps take the
    default decode launch."""
    _check(torch.bfloat16, 2e-2, None, None, prefill=launch)


def _check(dtype, tol, splits, launch, kv_dtype=None, scales=(1.0, 1.0), prefill=None):
    dev = torch.device("cuda")
    kv_dtype = kv_dtype or dtype
    ref = get_attention_backend("torch")(HQ, HKV, D, D**-0.5)
    tri = get_attention_backend("triton")(HQ, HKV, D, D**-0.5)
    tri.decode_splits = splits
    tri.decode_override = launch
    tri.prefill_override = prefill
    tri.k_scale, tri.v_scale = scales
    shape = ref.get_kv_cache_shape(NUM_BLOCKS, BS, HKV, D)
    cache_ref = torch.zeros(shape, dtype=dtype, device=dev)
    cache_tri = torch.zeros(shape, dtype=kv_dtype, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    free = torch.randperm(NUM_BLOCKS).tolist()
    tables: dict[str, list[int]] = {}
    lens: dict[str, int] = {}
    for batch in _steps():
        slots, starts, seq_lens = [], [0], []
        for seq, n in batch:
            ctx = lens.get(seq, 0)
            table = tables.setdefault(seq, [])
            for pos in range(ctx, ctx + n):
                if pos // BS >= len(table):
                    table.append(free.pop())
                slots.append(table[pos // BS] * BS + pos % BS)
            lens[seq] = ctx + n
            starts.append(starts[-1] + n)
            seq_lens.append(ctx + n)
        pad = 3  # padding rows, as a CUDA-graph batch has
        slots += [-1] * pad
        width = max(len(tables[s]) for s, _ in batch)
        bt = [tables[s] + [0] * (width - len(tables[s])) for s, _ in batch]

        def md():
            return AttentionMetadata(
                slot_mapping=torch.tensor(slots, device=dev),
                query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
                block_tables=torch.tensor(bt, dtype=torch.int32, device=dev),
                max_query_len=max(n for _, n in batch), max_seq_len=max(seq_lens), block_size=BS,
                query_start_loc_cpu=torch.tensor(starts, dtype=torch.int32),
                seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
            )

        t = len(slots)
        q, k, v = (torch.randn(t, h, D, generator=gen, device=dev, dtype=dtype) for h in (HQ, HKV, HKV))
        # The reference computes in float32 from the same (rounded) inputs: for an fp8
        # cache, the keys/values as the cache holds them, dequantized.
        kq, vq = k.float(), v.float()
        if kv_dtype != dtype:
            kq = (k.float() / scales[0]).to(kv_dtype).float() * scales[0]
            vq = (v.float() / scales[1]).to(kv_dtype).float() * scales[1]
        out_ref = ref.forward(q.float(), kq, vq, cache_ref.float(), md())
        cache_ref.copy_(_store_like(cache_ref, kq, vq, slots))
        out = tri.forward(q, k, v, cache_tri, md())
        n = starts[-1]
        if kv_dtype == dtype:
            assert torch.equal(cache_tri, cache_ref), "keys/values stored in the wrong slots"
        else:
            stored = torch.stack([cache_tri[0].float() * scales[0], cache_tri[1].float() * scales[1]])
            assert torch.equal(stored, cache_ref.float()), "fp8 keys/values stored wrong"
        err = (out[:n].float() - out_ref[:n]).norm() / out_ref[:n].norm()
        assert err < tol, f"{batch}: relative error {err:.2e} over {tol}"


def _store_like(cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: list[int]) -> torch.Tensor:
    """The cache after storing k/v at the non-padding slots (the expected cache)."""
    out = cache.clone()
    hkv, d = k.shape[1], k.shape[2]
    rows = [i for i, s in enumerate(slots) if s >= 0]
    idx = torch.tensor([slots[i] for i in rows], device=cache.device)
    out[0].view(-1, hkv, d)[idx] = k[rows].to(cache.dtype)
    out[1].view(-1, hkv, d)[idx] = v[rows].to(cache.dtype)
    return out


def _decode_batch(dev, dtype, lens, kv_dtype=None, seed=0, num_blocks=1024):
    """A decode step over random cached contexts of ``lens`` tokens (plus 2 padding rows,
    whose output rows are unspecified)."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    shape = get_attention_backend("torch").get_kv_cache_shape(num_blocks, BS, HKV, D)
    cache = torch.randn(shape, generator=gen, device=dev, dtype=dtype).to(kv_dtype or dtype)
    per_seq = max(-(-n // BS) for n in lens)
    tables = torch.randperm(num_blocks, device=dev)[: len(lens) * per_seq].view(len(lens), per_seq).int()
    slots = [int(tables[i, (n - 1) // BS]) * BS + (n - 1) % BS for i, n in enumerate(lens)] + [-1, -1]
    md = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=dev),
        query_start_loc=torch.arange(len(lens) + 1, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev), block_tables=tables,
        max_query_len=1, max_seq_len=max(lens), block_size=BS)
    q = torch.randn(len(slots), HQ, D, generator=gen, device=dev, dtype=dtype)
    return cache, md, q


@pytest.mark.parametrize("dtype,kv_dtype", [(torch.bfloat16, None), (torch.float32, None),
                                            (torch.bfloat16, torch.float8_e4m3fn)])
@pytest.mark.parametrize("normed", [False, True])
def test_rotary_kernel_stores_keys_and_values_as_the_backend(dtype, kv_dtype, normed):
    """The rotary kernels' fused KV store (``rotate_and_store``'s path) leaves the queries,
    keys and the cache exactly as the rotation followed by the backend's own store does
    (padding slots untouched), and the attention over it equals ``forward``'s."""
    from forkless.attention import KVStoreTarget
    from forkless.ops import fused_triton

    dev = torch.device("cuda")
    lens = [40, 77, 5]
    cache, md, _ = _decode_batch(dev, dtype, lens, kv_dtype)
    tri = get_attention_backend("triton")(HQ, HKV, D, D**-0.5)
    tri.k_scale, tri.v_scale = (0.5, 2.0) if kv_dtype is not None else (1.0, 1.0)
    gen = torch.Generator(device=dev).manual_seed(1)
    t = md.slot_mapping.shape[0]
    qkv = torch.randn(t, (HQ + 2 * HKV) * D, generator=gen, device=dev, dtype=dtype)
    angles = torch.tensor(lens + [0, 0], device=dev).float()[:, None] * torch.rand(D // 2, device=dev)
    emb = torch.cat((angles, angles), -1)[:, None, :]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    qw, kw = (torch.rand(D, generator=gen, device=dev, dtype=dtype) for _ in range(2))

    def run(fused):
        x, c = qkv.clone(), cache.clone()
        q, k, v = (p.view(t, -1, D) for p in x.split([HQ * D, HKV * D, HKV * D], -1))
        store = tri.kv_store_target(c, md) if fused else None
        if normed:
            fused_triton.qk_norm_rotary_(q, k, qw, kw, 1e-6, 1e-6, cos, sin, v if fused else None, store)
        else:
            fused_triton.rotary_(q, k, cos, sin, D, v if fused else None, store)
        out = tri.forward_stored(q, c, md) if fused else tri.forward(q, k, v, c, md)
        return x, c, out

    assert isinstance(tri.kv_store_target(cache, md), KVStoreTarget)
    x0, c0, out0 = run(False)
    x1, c1, out1 = run(True)
    assert torch.equal(x0, x1)
    assert torch.equal(c0.view(torch.uint8), c1.view(torch.uint8)), "cache differs from the backend's own store"
    assert not torch.equal(c1.view(torch.uint8), cache.view(torch.uint8)), "nothing was stored"
    assert torch.equal(out0[: len(lens)], out1[: len(lens)])
