"""Triton shrink / expand kernels for batched multi-LoRA on CUDA (punica SGMV style).

A wrapped layer adds ``(x[t] @ A_s) @ B_s`` (``B`` pre-scaled) to the rows of the tokens
``t`` of each adapter slot ``s``: :func:`lora_shrink` computes ``x @ A`` for every stacked
projection at once, :func:`lora_expand` adds every projection's ``h_i @ B_i`` into its
columns of the base layer's output, also in one launch: two launches per wrapped layer.
Small steps (decode, verification: what CUDA graphs hold) of a layer whose shrink weights
are folded into its base GEMM (:mod:`forkless.lora.layers`) skip the shrink and run
:func:`lora_expand_folded` alone: one launch per wrapped layer, which is what a decode graph
pays for (the work itself is tiny; each launch costs microseconds in a graph).

Invariants:
    * A step is described by two int32 device tensors that the caller keeps in persistent
      buffers: ``sorted_tokens`` (the step's adapter tokens, grouped by slot) and
      ``seg_start`` (``[max_loras + 1]``: slot ``s``'s tokens are
      ``sorted_tokens[seg_start[s]:seg_start[s + 1]]``). Base-model tokens are in no
      segment. The launch grid depends only on the token count ``T``, the slot count and
      the weight shapes, never on which adapters a step uses, so a captured CUDA graph
      replays right for any mix of adapters once those two buffers are rewritten.
    * Programs whose token block lies past their slot's segment exit at once: a step with
      no adapter token (or a slot no token uses) costs launches, not work.
    * :func:`lora_shrink` writes float32 partial sums per split of the reduction
      (``[split_k, T, N]``; rows of base tokens are left unwritten); :func:`lora_expand`
      sums the splits, rounds to the weight dtype (where the torch path rounds ``x @ A``)
      and rounds ``h @ B`` once more before adding it, as the torch path does. Each token is
      in one segment at most, so every output element is written by one program: no
      atomics, and results do not depend on scheduling.
    * This module imports Triton: :mod:`forkless.lora.layers` imports it only for CUDA
      tensors, so importing forkless on a machine without Triton still works.
"""

from __future__ import annotations

from itertools import accumulate

import torch
import triton
import triton.language as tl


@triton.jit
def _shrink_kernel(
    x_ptr, a_ptr, h_ptr, tok_ptr, seg_ptr,
    K, N,
    sx_t, sx_k, sa_s, sa_k, sa_n, sh_s, sh_t, sh_n,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_mn = tl.program_id(0)
    pid_k = tl.program_id(1)
    slot = tl.program_id(2)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid_mn // num_n
    pid_n = pid_mn % num_n
    start = tl.load(seg_ptr + slot)
    length = tl.load(seg_ptr + slot + 1) - start
    if pid_m * BLOCK_M >= length:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < length
    tok = tl.load(tok_ptr + start + offs_m, mask=m_mask, other=0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    a_base = a_ptr + slot.to(tl.int64) * sa_s
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Split s reduces k-blocks s, s + SPLIT_K, ...: small batches get SPLIT_K times the
    # programs, and the expand kernel sums the splits.
    for it in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        kk = offs_k + it * BLOCK_K * SPLIT_K
        k_mask = kk < K
        xv = tl.load(x_ptr + tok[:, None] * sx_t + kk[None, :] * sx_k,
                     mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        av = tl.load(a_base + kk[:, None] * sa_k + offs_n[None, :] * sa_n,
                     mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if IEEE:  # float32 models: full precision, as torch's default float32 matmul
            acc += tl.dot(xv, av, input_precision="ieee")
        else:
            acc += tl.dot(xv, av)
    tl.store(h_ptr + pid_k * sh_s + tok[:, None] * sh_t + offs_n[None, :] * sh_n, acc,
             mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _slice_bounds(i: tl.constexpr, OFF1, OFF2, W):
    """Columns ``[lo, hi)`` of y that stacked projection ``i`` (0, 1 or 2) owns."""
    if i == 0:
        lo = 0
        hi = OFF1
    elif i == 1:
        lo = OFF1
        hi = OFF2
    else:
        lo = OFF2
        hi = W
    return lo, hi


@triton.jit
def _expand_kernel(
    h_ptr, b_ptr, y_ptr, tok_ptr, seg_ptr,
    R, W, OFF1, OFF2,
    sh_s, sh_t, sh_n, sb_s, sb_r, sb_w, sy_t, sy_w,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, SPLIT_K: tl.constexpr,
    NUM_SLICES: tl.constexpr, IEEE: tl.constexpr,
):
    pid_mn = tl.program_id(0)
    slot = tl.program_id(1)
    num_n = tl.cdiv(W, BLOCK_N)
    pid_m = pid_mn // num_n
    pid_n = pid_mn % num_n
    start = tl.load(seg_ptr + slot)
    length = tl.load(seg_ptr + slot + 1) - start
    if pid_m * BLOCK_M >= length:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < length
    tok = tl.load(tok_ptr + start + offs_m, mask=m_mask, other=0).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < R
    col0 = pid_n * BLOCK_N
    offs_w = col0 + tl.arange(0, BLOCK_N)
    w_mask = offs_w < W
    b_base = b_ptr + slot.to(tl.int64) * sb_s
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Stacked projection i owns columns [lo, hi) of y and columns [i R, (i + 1) R) of h;
    # a column block usually lies in one of them, but may straddle two.
    for i in tl.static_range(NUM_SLICES):
        lo, hi = _slice_bounds(i, OFF1, OFF2, W)
        if (col0 < hi) & (col0 + BLOCK_N > lo):
            h = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                h += tl.load(h_ptr + s * sh_s + tok[:, None] * sh_t + (i * R + offs_r[None, :]) * sh_n,
                             mask=m_mask[:, None] & r_mask[None, :], other=0.0)
            hv = h.to(b_ptr.dtype.element_ty)  # x @ A rounded to the model dtype, as in torch
            in_slice = (offs_w >= lo) & (offs_w < hi)
            bv = tl.load(b_base + offs_r[:, None] * sb_r + offs_w[None, :] * sb_w,
                         mask=r_mask[:, None] & in_slice[None, :], other=0.0)
            if IEEE:
                acc += tl.dot(hv, bv, input_precision="ieee")
            else:
                acc += tl.dot(hv, bv)
    y_ptrs = y_ptr + tok[:, None] * sy_t + offs_w[None, :] * sy_w
    mask = m_mask[:, None] & w_mask[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0)
    # Each column got one projection's delta: round it, then the sum, as torch computes the
    # delta in the model dtype and then y += delta.
    out = y.to(tl.float32) + acc.to(y.dtype).to(tl.float32)
    tl.store(y_ptrs, out.to(y.dtype), mask=mask)


@triton.jit
def _expand_folded_kernel(
    z_ptr, b_ptr, y_ptr, slot_ptr,
    T, W, R, NR, SR, OFF1, OFF2,
    sz_t, sb_k, sb_w, sy_t,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_SLICES: tl.constexpr,
    SKIP: tl.constexpr, IEEE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < T
    col0 = pid_n * BLOCK_N
    offs_w = col0 + tl.arange(0, BLOCK_N)
    w_mask = offs_w < W
    z_row = z_ptr + offs_m.to(tl.int64) * sz_t
    mask = m_mask[:, None] & w_mask[None, :]
    # The base output first: its load does not wait for the slots (launch latency is most
    # of this kernel's time at decode sizes).
    y = tl.load(z_row[:, None] + offs_w[None, :], mask=mask, other=0.0)
    slot = tl.load(slot_ptr + offs_m, mask=m_mask, other=-1)
    lora = m_mask & (slot >= 0)
    if SKIP:
        lo_slot = tl.min(tl.where(lora, slot, 1 << 30))
        hi_slot = tl.max(tl.where(lora, slot, -1))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # The tokens of a block may each use another slot. Row k = s R + r of the slots' stacked
    # B ([slots R, W]) pairs with column W + s NR + i R + r of z (the GEMM's x @ A_{s,i},
    # already rounded to the model dtype, as the torch path rounds x @ A); each token
    # keeps only its own slot's columns, so one dense dot over every slot's rank gives each
    # token its own delta, and the tensor cores do it without a serial loop over tokens.
    for i in tl.static_range(NUM_SLICES):
        lo, hi = _slice_bounds(i, OFF1, OFF2, W)
        if (col0 < hi) & (col0 + BLOCK_N > lo):
            cols = w_mask & (offs_w >= lo) & (offs_w < hi)
            for k0 in range(0, SR, BLOCK_K):
                # With several chunks, those of slots no token of the block uses are skipped.
                if SKIP:
                    run = (k0 // R <= hi_slot) & ((k0 + BLOCK_K - 1) // R >= lo_slot)
                else:
                    run = True
                if run:
                    kk = k0 + tl.arange(0, BLOCK_K)
                    k_slot = kk // R
                    hv = tl.load(z_row[:, None] + W + k_slot[None, :] * NR + i * R + (kk % R)[None, :],
                                 mask=lora[:, None] & (k_slot[None, :] == slot[:, None]) & (kk < SR)[None, :],
                                 other=0.0)
                    bv = tl.load(b_ptr + kk[:, None] * sb_k + offs_w[None, :] * sb_w,
                                 mask=(kk < SR)[:, None] & cols[None, :], other=0.0)
                    if IEEE:
                        acc += tl.dot(hv, bv, input_precision="ieee")
                    else:
                        acc += tl.dot(hv, bv)
    # As in _expand_kernel: the delta rounded to the model dtype, then the sum. A row of
    # no adapter (the base model's, or a graph's padding) adds an exact zero.
    out = y.to(tl.float32) + acc.to(y.dtype).to(tl.float32)
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * sy_t + offs_w[None, :], out.to(y.dtype), mask=mask)


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))


def shrink_split(num_tokens: int, in_features: int) -> int:
    """How many splits of the reduction :func:`lora_shrink` uses for this shape.

    Decode-sized batches have few token blocks per slot, so the reduction over
    ``in_features`` is split to keep more multiprocessors busy; prefill-sized ones have
    parallelism enough.
    """
    if num_tokens > 256:
        return 1
    return max(1, min(8, in_features // 256))


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, sorted_tokens: torch.Tensor,
                seg_start: torch.Tensor, num_slots: int) -> torch.Tensor:
    """``x[t] @ lora_a[s]`` for every adapter token ``t`` of every slot ``s``.

    Args:
        x: ``[T, K]`` layer input.
        lora_a: ``[slots, K, N]`` shrink weights (A transposed, projections side by side).
        sorted_tokens: ``int32`` token indexes grouped by slot (see the module notes).
        seg_start: ``[num_slots + 1]`` int32 segment starts into ``sorted_tokens``.
        num_slots: Slots to cover (the grid's third axis; fixed for a captured graph).

    Returns:
        ``[split_k, T, N]`` float32 partial sums (see :func:`shrink_split`); rows of
        base-model tokens hold garbage and must not be read.
    """
    t, k = x.shape
    n = lora_a.shape[2]
    split = shrink_split(t, k)
    h = torch.empty((split, t, n), dtype=torch.float32, device=x.device)
    if t == 0:
        return h
    block_m = 16 if t <= 256 else 64
    block_n = min(128, _pow2(n))
    block_k = 128 if block_m == 16 else 64
    grid = (triton.cdiv(t, block_m) * triton.cdiv(n, block_n), split, num_slots)
    _shrink_kernel[grid](
        x, lora_a, h, sorted_tokens, seg_start, k, n,
        x.stride(0), x.stride(1), lora_a.stride(0), lora_a.stride(1), lora_a.stride(2),
        h.stride(0), h.stride(1), h.stride(2),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split,
        IEEE=x.dtype == torch.float32,
    )
    return h


def lora_expand(h: torch.Tensor, lora_b: torch.Tensor, y: torch.Tensor, widths: list[int],
                sorted_tokens: torch.Tensor, seg_start: torch.Tensor, num_slots: int) -> None:
    """``y[t, cols_i] += h[t, i-th rank block] @ lora_b[s][:, cols_i]`` in place, for every
    stacked projection ``i`` and every adapter token ``t`` of every slot ``s``: one launch.

    Args:
        h: ``[split_k, T, len(widths) * R]`` :func:`lora_shrink`'s result.
        lora_b: ``[slots, R, sum(widths)]`` expand weights (scaled, transposed), the
            projections side by side in column order.
        y: ``[T, sum(widths)]`` the base layer's output.
        widths: Output width of each stacked projection (at most 3).
        sorted_tokens: As for :func:`lora_shrink`.
        seg_start: As for :func:`lora_shrink`.
        num_slots: As for :func:`lora_shrink`.
    """
    split, t, nr = h.shape
    n = len(widths)
    if not 1 <= n <= 3:
        raise ValueError(f"lora_expand: 1 to 3 stacked projections, got {n}")
    r = nr // n
    w = lora_b.shape[2]
    if t == 0:
        return
    bounds = list(accumulate(widths))
    off1 = bounds[0] if n > 1 else w
    off2 = bounds[1] if n > 2 else w
    block_m = 16 if t <= 256 else 64
    block_n = 128 if block_m == 16 else 64
    grid = (triton.cdiv(t, block_m) * triton.cdiv(w, block_n), num_slots)
    _expand_kernel[grid](
        h, lora_b, y, sorted_tokens, seg_start, r, w, off1, off2,
        h.stride(0), h.stride(1), h.stride(2), lora_b.stride(0), lora_b.stride(1), lora_b.stride(2),
        y.stride(0), y.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=_pow2(r), SPLIT_K=split, NUM_SLICES=n,
        IEEE=y.dtype == torch.float32,
    )


def lora_expand_folded(z: torch.Tensor, lora_b: torch.Tensor, widths: list[int], token_slot: torch.Tensor,
                       rank: int) -> torch.Tensor:
    """The layer's output from a GEMM that also computed every slot's shrink: one launch.

    Args:
        z: ``[T, W + slots * len(widths) * rank]`` ``x @ [W_base; A_0; A_1; ...]^T``: the
            base output in its first ``W = sum(widths)`` columns, then slot ``s``'s
            ``x @ A_{s,i}^T`` in columns ``W + (s * len(widths) + i) * rank`` onwards.
        lora_b: ``[slots, rank, W]`` expand weights (scaled, transposed), the projections
            side by side in column order.
        widths: Output width of each stacked projection (at most 3).
        token_slot: ``int32``, at least ``T`` entries: each token's slot, or -1 (the base
            model, or a CUDA graph's padding row).
        rank: The slots' (padded) rank.

    Returns:
        ``[T, W]`` contiguous: the base output plus each adapter token's delta.
    """
    if z.stride(1) != 1:
        z = z.contiguous()
    t = z.shape[0]
    n = len(widths)
    if not 1 <= n <= 3:
        raise ValueError(f"lora_expand_folded: 1 to 3 stacked projections, got {n}")
    w = sum(widths)
    y = torch.empty((t, w), dtype=z.dtype, device=z.device)
    if t == 0:
        return y
    bounds = list(accumulate(widths))
    off1 = bounds[0] if n > 1 else w
    off2 = bounds[1] if n > 2 else w
    slots = lora_b.shape[0]
    if lora_b.stride(0) != rank * lora_b.stride(1):
        raise ValueError("lora_expand_folded: lora_b's slots must be stacked ([slots, rank, W] contiguous rows)")
    block_n = 64
    block_k = min(128, _pow2(slots * rank))
    grid = (triton.cdiv(t, 16), triton.cdiv(w, block_n))
    _expand_folded_kernel[grid](
        z, lora_b, y, token_slot, t, w, rank, n * rank, slots * rank, off1, off2,
        z.stride(0), lora_b.stride(1), lora_b.stride(2), y.stride(0),
        BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, NUM_SLICES=n, SKIP=slots * rank > block_k,
        IEEE=z.dtype == torch.float32,
    )
    return y
