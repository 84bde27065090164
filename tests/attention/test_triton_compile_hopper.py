"""The paged attention kernels compile for a Hopper GPU (sm_90) on a machine without one.

Triton's interpreter (the other tests here) runs a kernel's Python, not its compiler: a kernel
the interpreter runs may still fail to compile for a GPU, and CI has no GPU. Triton's NVIDIA
backend compiles ahead of time for any target (its wheel carries ptxas), so every launch the
backend takes by default, and the options its sweeps try, must compile for sm_90 and fit an
H100's shared memory (227 KiB a block). Shapes: Qwen3-0.6B's heads (16 query heads, 8 KV
heads, head dim 128).
"""

from __future__ import annotations

import pytest

from forkless.triton_utils import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="Triton is not installed")

HOPPER_SHARED = 227 * 1024
HKV, GROUP, D = 8, 2, 128


#: Integer arguments that a launch's specialisation sees as multiples of 16, as Triton's JIT
#: does at run time (row strides of 16-bit tensors with 128-wide heads, the block size); the
#: block tables' row stride (the longest sequence's blocks) need not be one.
_DIVISIBLE = {"q_stride_t", "q_stride_h", "o_stride_t", "o_stride_h", "cache_kv_stride", "block_size"}


def _compile(fn, types: dict[str, str], constexprs: dict[str, object], num_warps: int, num_stages: int):
    """``fn`` compiled for sm_90: pointer and scalar arguments typed by ``types`` (the rest
    int32), ``constexprs`` as given. Pointers are 16-byte aligned (as torch's allocations
    are): without that the compiler cannot vectorise or pipeline a load, and the kernel
    compiled would not be the one a GPU runs."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, consts, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            consts[(i,)] = constexprs[name]
            continue
        signature[name] = types.get(name, "i32")
        if signature[name].startswith("*") or name in _DIVISIBLE:
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def _attention(dtype: str = "bf16", cache: str | None = None, *, block_q: int, block_m: int, block_n: int,
               splits: int = 1, num_warps: int = 4, num_stages: int = 2, **flags: object):
    """The paged attention kernel compiled as ``TritonAttentionBackend.forward_stored``
    launches it (queries of ``dtype``, a cache of ``cache``, default the same)."""
    from forkless.attention.backends.triton_kernels import paged_attention_kernel

    fp32 = dtype == "fp32"
    types = {"q_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "cache_ptr": f"*{cache or dtype}",
             "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32", "seq_order_ptr": "*i64",
             "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "scale_log2": "fp32", "v_scale": "fp32"}
    constexprs = dict(NUM_KV_HEADS=HKV, GROUP=GROUP, HEAD_DIM=D, BLOCK_D=D, BLOCK_Q=block_q, BLOCK_M=block_m,
                      BLOCK_N=block_n, KV_PER_PROG=1, ONE_BLOCK=False, KV_FP8=0, KEYS_FIRST=False,
                      NUM_SPLITS=splits, IEEE=fp32, HEADS_FAST=False, PDL=False, SPLIT_CAUSAL=False, ORDERED=False)
    constexprs.update(flags)
    return _compile(paged_attention_kernel, types, constexprs, num_warps, num_stages)


def _decode(launch, **flags: object):
    d = dict(block_q=1, block_m=max(16, launch.kv_per_prog * GROUP), num_warps=launch.num_warps,
             num_stages=launch.num_stages, HEADS_FAST=launch.heads_fast, ORDERED=launch.longest_first)
    return d | flags


def _prefill(launch, **flags: object):
    block_q = launch.rows // GROUP
    d = dict(block_q=block_q, block_m=max(16, block_q * GROUP), block_n=launch.block_n, num_warps=launch.num_warps,
             num_stages=launch.num_stages, SPLIT_CAUSAL=launch.split_causal)
    return d | flags


def _cases():
    from forkless.attention.backends.triton_paged import (
        DECODE_DEFAULT,
        DECODE_DEFAULT_FP8,
        PREFILL_DEFAULT,
        PREFILL_SPLIT,
        DecodeLaunch,
    )

    return {
        # A large batch (at most two splits), the sequences longest first.
        "decode": _attention(**_decode(DECODE_DEFAULT, block_n=64)),
        # A small batch: context splits.
        "decode, 4 splits": _attention(**_decode(DECODE_DEFAULT, block_n=64, splits=4)),
        "decode, fp8 cache": _attention(cache="fp8e4nv", **_decode(DECODE_DEFAULT_FP8, block_n=DECODE_DEFAULT_FP8.block_n,
                                                                     KV_FP8=3, KEYS_FIRST=True)),
        "decode, 128-token tiles, in batch order": _attention(**_decode(DecodeLaunch(num_stages=2, heads_fast=True),
                                                                        block_n=128)),
        # 16-bit queries, heads of at most 128: split causal, 128 x 128 tiles.
        "prefill": _attention(**_prefill(PREFILL_SPLIT)),
        "prefill, fp16": _attention("fp16", **_prefill(PREFILL_SPLIT)),
        # What float32 queries (and heads over 128) take.
        "prefill, float32": _attention("fp32", **_prefill(PREFILL_DEFAULT)),
        "prefill, 64 x 64 tiles": _attention(**_prefill(PREFILL_DEFAULT)),
    }


def test_attention_kernels_compile_for_hopper() -> None:
    from forkless.attention.backends.triton_kernels import combine_splits_kernel

    for name, kernel in _cases().items():
        assert kernel.asm.get("cubin"), f"{name}: no cubin"
        assert kernel.metadata.shared <= HOPPER_SHARED, f"{name}: {kernel.metadata.shared} bytes of shared memory"
    merge = _compile(combine_splits_kernel, {"part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "out_ptr": "*bf16",
                                             "qsl_ptr": "*i32"},
                     dict(NUM_HEADS=HKV * GROUP, HEAD_DIM=D, BLOCK_D=D, NUM_SPLITS=4, BLOCK_S=4, PDL=False), 4, 2)
    assert merge.asm.get("cubin")
