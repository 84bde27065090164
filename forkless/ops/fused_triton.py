"""Triton kernels that fuse the small element-wise steps of a decoder layer.

In PyTorch ops, one RMSNorm with a residual add is about nine kernels, rotary embeddings
ten, SiLU-and-mul two: per layer some 25 launches between the four matmuls. At batch 1
on a large GPU each of them costs a few microseconds however little it computes, so
they add up to a sizeable share of a decode step. Each function here is one launch.

Every kernel rounds where the PyTorch code it replaces rounds (the ``dtype`` of each
intermediate), so outputs match the reference layers to the last bit in float32 and
within one rounding step in half precision. This module imports Triton: use it through
:mod:`forkless.ops.kernels`, which imports it only where a custom op binds ``forward_cuda``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from forkless.ops.fused_buffers import rms_norm_buffers
from forkless.triton_utils.kv_cache import cache_value
from forkless.triton_utils.pdl import pdl_enter, use_pdl

if TYPE_CHECKING:
    from forkless.attention.interface import KVStoreTarget


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    x_stride_t, x_stride_h, res_stride_t, out_stride_t, out_stride_h, res_out_stride_t,
    num_rows, eps, H: tl.constexpr, N: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    # ROWS rows (token t, head h) per program: one row of a per-head norm is 128 values,
    # far too little work for a program of its own at prefill sizes.
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    t = r // H
    h = r % H
    offs = tl.arange(0, BLOCK)
    cols = offs < N
    mask = (r < num_rows)[:, None] & cols[None, :]
    x = tl.load(x_ptr + (t * x_stride_t + h * x_stride_h)[:, None] + offs[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = x + tl.load(res_ptr + (t * res_stride_t)[:, None] + offs[None, :], mask=mask, other=0.0)
        tl.store(res_out_ptr + (t * res_out_stride_t)[:, None] + offs[None, :], x, mask=mask)
    x32 = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x32 * x32, axis=1) / N + eps)
    normed = (x32 * rstd[:, None]).to(x.dtype)
    w = tl.load(w_ptr + offs, mask=cols, other=0.0)
    tl.store(out_ptr + (t * out_stride_t + h * out_stride_h)[:, None] + offs[None, :], w[None, :] * normed,
             mask=mask)


# Values a program of the row-wise kernels handles (rows x row length), at most.
_PROGRAM_VALUES = 4096


def _rows_per_program(num_rows: int, block: int) -> int:
    """Rows per program: enough for ~_PROGRAM_VALUES values, no more than there are rows
    (a power of two, so that few variants compile)."""
    return max(1, min(triton.next_power_of_2(num_rows), _PROGRAM_VALUES // block))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm over the last dimension, after adding ``residual`` when given.

    Args:
        x: ``[T, N]`` or ``[T, H, N]`` (per-head norm); the last dimension contiguous.
        weight: ``[N]``.
        eps: Added to the mean square.
        residual: ``[T, N]``, only with a 2-D ``x``.

    Returns:
        ``(normalised, x + residual)``; the second item is None without a residual.
    """
    x3, residual, out, res_out = rms_norm_buffers(x, residual)
    t, h, n = x3.shape
    block = triton.next_power_of_2(n)
    rows = _rows_per_program(t * h, block)
    pdl = use_pdl(x.device, t)
    _rms_norm_kernel[(triton.cdiv(t * h, rows),)](
        x3, residual if residual is not None else x3, weight, out,
        res_out if res_out is not None else out,
        x3.stride(0), x3.stride(1),
        residual.stride(0) if residual is not None else 0,
        out.stride(0), out.stride(1),
        res_out.stride(0) if res_out is not None else 0,
        t * h, eps, H=h, N=n, BLOCK=block, ROWS=rows, HAS_RESIDUAL=residual is not None, PDL=pdl,
        num_warps=4 if block * rows <= 2048 else 8, launch_pdl=pdl,
    )
    return (out if x.dim() == 3 else out.squeeze(1)), res_out


@triton.jit
def _rotate_and_store(at, x1, x2, cos_ptr, sin_ptr, cs, mask, HALF: tl.constexpr):
    # x * cos + rotate_half(x) * sin for the halves x1, x2 of rows starting at ``at``,
    # rounding each product and the sum like PyTorch; cos/sin repeat after HALF (the tables
    # are cat(freqs, freqs)), so ``cs`` indexes their first half. Returns the two halves.
    cos = tl.load(cos_ptr + cs, mask=mask, other=0.0)
    sin = tl.load(sin_ptr + cs, mask=mask, other=0.0)
    lo = ((x1 * cos).to(x1.dtype) - (x2 * sin).to(x1.dtype)).to(x1.dtype)
    hi = ((x2 * cos).to(x1.dtype) + (x1 * sin).to(x1.dtype)).to(x1.dtype)
    tl.store(at, lo, mask=mask)
    tl.store(at + HALF, hi, mask=mask)
    return lo, hi


@triton.jit
def _store_kv_head(k1, k2, t, tmask, kh, mask, v_ptr, v_stride_t, v_stride_h, cache_ptr, slot_ptr, slot_stride,
                   cache_kv_stride, k_inv_scale, v_inv_scale, offs, HALF: tl.constexpr, KV_FP8: tl.constexpr):
    # The rotated key head (halves k1, k2) and its value head into each token's cache slot,
    # as the attention backend's store_kv_kernel writes them (slot -1: padding, skipped).
    slot = tl.load(slot_ptr + t, mask=tmask, other=-1)
    keep = mask & (slot >= 0)[:, None]
    dst = cache_ptr + (slot.to(tl.int64) * slot_stride + kh * (2 * HALF))[:, None] + offs[None, :]
    src = v_ptr + (t * v_stride_t + kh * v_stride_h)[:, None] + offs[None, :]
    v1 = tl.load(src, mask=keep, other=0.0)
    v2 = tl.load(src + HALF, mask=keep, other=0.0)
    tl.store(dst, cache_value(k1, k_inv_scale, cache_ptr, KV_FP8), mask=keep)
    tl.store(dst + HALF, cache_value(k2, k_inv_scale, cache_ptr, KV_FP8), mask=keep)
    tl.store(dst + cache_kv_stride, cache_value(v1, v_inv_scale, cache_ptr, KV_FP8), mask=keep)
    tl.store(dst + cache_kv_stride + HALF, cache_value(v2, v_inv_scale, cache_ptr, KV_FP8), mask=keep)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h, cs_stride_t, num_tokens,
    v_ptr, v_stride_t, v_stride_h, cache_ptr, slot_ptr, slot_stride, cache_kv_stride, k_inv_scale, v_inv_scale,
    NUM_Q_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr, TOKENS: tl.constexpr,
    STORE: tl.constexpr = False, KV_FP8: tl.constexpr = False, PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    # One head of TOKENS tokens per program (one token's head is 128 values: too little
    # work for a program at prefill sizes). STORE: a key head also goes to the KV cache,
    # with its value head (the attention backend's store, without a launch of its own).
    t = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    h = tl.program_id(1)
    if h < NUM_Q_HEADS:
        base = q_ptr + t * q_stride_t + h * q_stride_h
    else:
        base = k_ptr + t * k_stride_t + (h - NUM_Q_HEADS) * k_stride_h
    offs = tl.arange(0, BLOCK)
    tmask = t < num_tokens
    mask = tmask[:, None] & (offs < HALF)[None, :]
    at = base[:, None] + offs[None, :]
    x1 = tl.load(at, mask=mask, other=0.0)
    x2 = tl.load(at + HALF, mask=mask, other=0.0)
    lo, hi = _rotate_and_store(at, x1, x2, cos_ptr, sin_ptr, (t * cs_stride_t)[:, None] + offs[None, :], mask, HALF)
    if STORE:
        if h >= NUM_Q_HEADS:
            _store_kv_head(lo, hi, t, tmask, h - NUM_Q_HEADS, mask, v_ptr, v_stride_t, v_stride_h, cache_ptr,
                           slot_ptr, slot_stride, cache_kv_stride, k_inv_scale, v_inv_scale, offs, HALF, KV_FP8)


def _store_args(v: torch.Tensor | None, store: "KVStoreTarget | None") -> dict:
    """The rotary kernels' KV-store arguments, by name (placeholders when not storing)."""
    if store is None or v is None:
        return dict(v_ptr=0, v_stride_t=0, v_stride_h=0, cache_ptr=0, slot_ptr=0, slot_stride=0, cache_kv_stride=0,
                    k_inv_scale=1.0, v_inv_scale=1.0, STORE=False, KV_FP8=False)
    cache = store.cache
    return dict(v_ptr=v, v_stride_t=v.stride(0), v_stride_h=v.stride(1), cache_ptr=cache,
                slot_ptr=store.slot_mapping, slot_stride=cache.stride(-3), cache_kv_stride=cache.stride(0),
                k_inv_scale=store.k_inv_scale, v_inv_scale=store.v_inv_scale, STORE=True,
                KV_FP8=cache.dtype == torch.float8_e4m3fn)


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            rotary_dim: int, v: torch.Tensor | None = None, store: "KVStoreTarget | None" = None) -> None:
    """Rotate the first ``rotary_dim`` channels of every query and key head, in place.

    Args:
        q: ``[T, Hq, D]``, head dimension contiguous.
        k: ``[T, Hkv, D]``, same.
        cos: ``[T, 1, rotary_dim]`` (``cat(freqs, freqs).cos()``), dtype of ``q``.
        sin: Same shape, the sines.
        rotary_dim: Rotated channels per head (``D`` unless partial rotary).
        v: ``[T, Hkv, D]`` values, head dimension contiguous; with ``store``.
        store: Also write the rotated keys and ``v`` into this paged cache (whole heads:
            ``rotary_dim`` must be ``D``), as the attention backend's store would.
    """
    half = rotary_dim // 2
    t, hq = q.shape[0], q.shape[1]
    if cos.stride(-1) != 1 or sin.stride(0) != cos.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    if store is not None and rotary_dim != q.shape[2]:
        raise ValueError(f"a fused KV store needs the rotation over whole heads (rotary_dim {rotary_dim}, "
                         f"head size {q.shape[2]})")
    block = triton.next_power_of_2(half)
    tokens = _rows_per_program(t, 2 * block)
    pdl = use_pdl(q.device, t)
    _rotary_kernel[(triton.cdiv(t, tokens), hq + k.shape[1])](
        q, k, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), t,
        **_store_args(v, store), NUM_Q_HEADS=hq, HALF=half, BLOCK=block, TOKENS=tokens, PDL=pdl,
        num_warps=1 if tokens * block <= 256 else 4, launch_pdl=pdl,
    )


@triton.jit
def _qk_norm_rotary_kernel(
    q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h, cs_stride_t, num_tokens, q_eps, k_eps,
    v_ptr, v_stride_t, v_stride_h, cache_ptr, slot_ptr, slot_stride, cache_kv_stride, k_inv_scale, v_inv_scale,
    NUM_Q_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr, TOKENS: tl.constexpr,
    STORE: tl.constexpr = False, KV_FP8: tl.constexpr = False, PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    # Qwen3's per-head RMSNorm of queries and keys, then their rotation: one program per
    # head of TOKENS tokens, each head row read and written once (three launches before);
    # STORE as in _rotary_kernel.
    t = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    h = tl.program_id(1)
    if h < NUM_Q_HEADS:
        base = q_ptr + t * q_stride_t + h * q_stride_h
        w_ptr = qw_ptr
        eps = q_eps
    else:
        base = k_ptr + t * k_stride_t + (h - NUM_Q_HEADS) * k_stride_h
        w_ptr = kw_ptr
        eps = k_eps
    offs = tl.arange(0, BLOCK)
    cols = offs < HALF
    tmask = t < num_tokens
    mask = tmask[:, None] & cols[None, :]
    at = base[:, None] + offs[None, :]
    x1 = tl.load(at, mask=mask, other=0.0)
    x2 = tl.load(at + HALF, mask=mask, other=0.0)
    # RMSNorm as _rms_norm_kernel computes it (float32 statistics, rounded to the dtype).
    a32 = x1.to(tl.float32)
    b32 = x2.to(tl.float32)
    rstd = tl.math.rsqrt((tl.sum(a32 * a32, axis=1) + tl.sum(b32 * b32, axis=1)) / (2 * HALF) + eps)
    w1 = tl.load(w_ptr + offs, mask=cols, other=0.0)
    w2 = tl.load(w_ptr + HALF + offs, mask=cols, other=0.0)
    n1 = (w1[None, :] * (a32 * rstd[:, None]).to(x1.dtype)).to(x1.dtype)
    n2 = (w2[None, :] * (b32 * rstd[:, None]).to(x1.dtype)).to(x1.dtype)
    lo, hi = _rotate_and_store(at, n1, n2, cos_ptr, sin_ptr, (t * cs_stride_t)[:, None] + offs[None, :], mask, HALF)
    if STORE:
        if h >= NUM_Q_HEADS:
            _store_kv_head(lo, hi, t, tmask, h - NUM_Q_HEADS, mask, v_ptr, v_stride_t, v_stride_h, cache_ptr,
                           slot_ptr, slot_stride, cache_kv_stride, k_inv_scale, v_inv_scale, offs, HALF, KV_FP8)


def qk_norm_rotary_(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                    q_eps: float, k_eps: float, cos: torch.Tensor, sin: torch.Tensor,
                    v: torch.Tensor | None = None, store: "KVStoreTarget | None" = None) -> None:
    """Per-head RMSNorm of every query and key head, then rotary over the whole head, in place.

    The result equals :func:`rms_norm` of ``q`` and of ``k`` followed by :func:`rotary_`
    with ``rotary_dim`` the head size, in one launch.

    Args:
        q: ``[T, Hq, D]``, head dimension contiguous (``D`` even).
        k: ``[T, Hkv, D]``, same.
        q_weight: ``[D]`` the query norm's weight.
        k_weight: ``[D]`` the key norm's weight.
        q_eps: The query norm's epsilon.
        k_eps: The key norm's epsilon.
        cos: ``[T, 1, D]`` (``cat(freqs, freqs).cos()``), dtype of ``q``.
        sin: Same shape, the sines.
        v: ``[T, Hkv, D]`` values, head dimension contiguous; with ``store``.
        store: Also write the normed, rotated keys and ``v`` into this paged cache.
    """
    t, hq, d = q.shape
    half = d // 2
    if cos.stride(-1) != 1 or sin.stride(0) != cos.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    block = triton.next_power_of_2(half)
    tokens = _rows_per_program(t, 2 * block)
    pdl = use_pdl(q.device, t)
    _qk_norm_rotary_kernel[(triton.cdiv(t, tokens), hq + k.shape[1])](
        q, k, q_weight, k_weight, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        cos.stride(0), t, q_eps, k_eps, **_store_args(v, store), NUM_Q_HEADS=hq, HALF=half, BLOCK=block,
        TOKENS=tokens, PDL=pdl,
        num_warps=1 if tokens * block <= 256 else 4, launch_pdl=pdl,
    )


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride_t, out_stride_t, D, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):
    pdl_enter(PDL)
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < D
    gate = tl.load(x_ptr + t * x_stride_t + offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + t * x_stride_t + D + offs, mask=mask, other=0.0)
    g32 = gate.to(tl.float32)
    silu = (g32 / (1.0 + tl.exp(-g32))).to(gate.dtype)
    tl.store(out_ptr + t * out_stride_t + offs, (silu * up).to(gate.dtype), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``x = [T, 2 * d]`` (gate first).

    Args:
        x: ``[T, 2 * d]``, last dimension contiguous.

    Returns:
        ``[T, d]``.
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    t, d = x.shape[0], x.shape[1] // 2
    out = torch.empty((t, d), dtype=x.dtype, device=x.device)
    block = 1024
    pdl = use_pdl(x.device, t)
    _silu_and_mul_kernel[(t, triton.cdiv(d, block))](
        x, out, x.stride(0), out.stride(0), d, BLOCK=block, PDL=pdl, num_warps=4, launch_pdl=pdl,
    )
    return out
