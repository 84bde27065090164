"""Triton kernels over the paged KV cache ``(2, num_blocks, block_size, Hkv, D)``.

The kernels:

* ``store_kv``: writes each new token's key and value into its cache slot (slot ``-1``
  is padding and is skipped, so CUDA-graph batches can be padded freely). An fp8 cache
  (``--kv-cache-dtype fp8``) stores ``x / scale`` rounded to e4m3, clamped to its finite
  range (+-448).
* ``paged_attention``: one program per (sequence, tile of new tokens, group of
  ``KV_PER_PROG`` KV heads). Query rows are (token, query head) pairs of the group, so a
  decode step still fills a tensor-core tile with the heads that share its KV heads. A
  key tile's rows are (token, KV head of the group) pairs: with ``KV_PER_PROG > 1`` one
  dot product scores every query head against every key row of the tile and a mask
  keeps only the pairs of the same KV head (the wasted products are free in a
  memory-bound decode step, and the rows of one token are contiguous in the cache, so
  the loads are wider). Keys are read from the cache through the block table, which
  covers prefill, chunked prefill and prefill on top of a prefix-cache hit with one code
  path (new keys are stored first). With ``ONE_BLOCK`` (the tile's tokens never cross a
  cache block) the tile reads one block-table entry instead of one per token. An fp8
  cache (``KV_FP8`` 1 or 2) is converted after loading, to the query dtype (1) or, for
  16-bit queries, to float16 with the queries (2). Route 1 is the one run on an H200: it is
  correct but slow (decode read the fp8 cache at 0.26-0.40 of the copy bandwidth, slower
  in absolute time than a bf16 cache at batch 512). Route 2 is an untried guess at why:
  e4m3 -> f16 is one hardware conversion per two elements on sm_89+, e4m3 -> bf16 is
  several. The key scale is folded into the softmax scale and the value scale applied to
  the output. ``KEYS_FIRST`` computes the scores transposed (keys as the first operand of
  the dot, so a converted fp8 tile needs no transpose); not yet run on a GPU. ``KV_FP8`` 3
  (with ``KEYS_FIRST``) takes the scores as an fp8 dot: each query row rounded to e4m3
  with its own scale (max |q| / 448), the key tile unconverted; the values as route 1. An
  fp8 dot becomes Hopper's fp8 MMA only with a 64-row first operand (16 rows: Triton
  converts both to float16), hence the keys first. On an H200 it read the cache 14-16 %
  faster than route 1 at batch 64-512 (benchmarks/README.md); the default for fp8 caches.
* a prefill launch may take the keys before a query tile's first position (visible to every
  row of the tile) in a loop of unmasked key tiles and only the rest with the causal mask
  (``SPLIT_CAUSAL``; not yet run on a GPU).
* a decode launch may walk the sequences longest first (``ORDERED``, an order of the
  batch's sequences computed on the device once a step): the programs of the longest
  contexts start first and the last wave holds short ones, instead of whichever long
  context happens to come last (not yet run on a GPU).
* split-KV decode (``paged_attention`` with ``NUM_SPLITS > 1`` + ``combine_splits``):
  when a decode batch has too few programs to fill the GPU, or contexts of very
  different lengths, each (sequence, KV-head group) is split along the context (at
  least two tiles a split) and the partial softmaxes are merged.

All grids depend only on tensor shapes and host integers known before the step, never
on device values, so the kernels can be captured in CUDA graphs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from forkless.triton_utils.kv_cache import cache_value
from forkless.triton_utils.pdl import pdl_enter

LOG2E = 1.4426950408889634


@triton.jit
def store_kv_kernel(
    k_ptr, v_ptr, cache_ptr, slot_ptr,
    k_stride_t, v_stride_t, cache_kv_stride,
    k_inv_scale, v_inv_scale,
    HKV_D: tl.constexpr, BLOCK: tl.constexpr, KV_FP8: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    offs = tl.arange(0, BLOCK)
    mask = (offs < HKV_D) & (slot >= 0)
    k = tl.load(k_ptr + t * k_stride_t + offs, mask=mask)
    v = tl.load(v_ptr + t * v_stride_t + offs, mask=mask)
    dst = cache_ptr + slot * HKV_D + offs
    tl.store(dst, cache_value(k, k_inv_scale, cache_ptr, KV_FP8), mask=mask)
    tl.store(dst + cache_kv_stride, cache_value(v, v_inv_scale, cache_ptr, KV_FP8), mask=mask)


@triton.jit
def _grid_ids(HEADS_FAST: tl.constexpr):
    """``(sequence, KV-head group, second axis)`` of this program. HEADS_FAST: the grid is
    (KV-head group, tile, sequence), so that the programs of one sequence's heads run side
    by side and read neighbouring bytes of the same cache blocks (a token's heads lie next
    to each other) instead of far apart in time; else (sequence, tile, KV-head group)."""
    if HEADS_FAST:
        return tl.program_id(2), tl.program_id(0), tl.program_id(1)
    return tl.program_id(0), tl.program_id(2), tl.program_id(1)


@triton.jit
def _split_range(kv_end, split, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """The keys ``[begin, end)`` of context split ``split`` of ``[0, kv_end)``: at least two
    tiles a split, so a short context leaves the last splits empty (they exit at once)
    instead of cutting it into one-tile slivers."""
    chunk = tl.maximum(tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), BLOCK_N), 2) * BLOCK_N
    begin = split * chunk
    return begin, tl.minimum(kv_end, begin + chunk)


@triton.jit
def _cache_slots(block_tables_ptr, seq, bt_stride, block_size, start_n, pos, valid, ONE_BLOCK: tl.constexpr):
    """The cache slots (int64) of sequence ``seq``'s tokens at positions ``pos`` of the key
    tile starting at ``start_n``, through its block table. ONE_BLOCK: the tile lies in one
    cache block, so one table entry serves it."""
    if ONE_BLOCK:
        blk = tl.load(block_tables_ptr + seq * bt_stride + start_n // block_size)
    else:
        blk = tl.load(block_tables_ptr + seq * bt_stride + pos // block_size, mask=valid, other=0)
    return blk.to(tl.int64) * block_size + pos % block_size


@triton.jit
def _store_partials(part_acc_ptr, part_ml_ptr, seq, split, head, acc, m_i, l_i, valid, offs_d, d_valid,
                    NUM_SPLITS: tl.constexpr, NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A split's partial softmax of decode rows (``seq``, ``head``), where
    :func:`combine_splits_kernel` reads it: acc [B, S, Hq, D], (m, l) [B, S, Hq, 2]."""
    row = (seq * NUM_SPLITS + split) * NUM_HEADS + head
    tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=valid[:, None] & d_valid[None, :])
    tl.store(part_ml_ptr + row * 2, m_i, mask=valid)
    tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=valid)


@triton.jit
def _attend_keys(acc, m_i, l_i, q, q_t, q_scale, q_pos, m_kv, kv_begin, kv_end, q_ptr, cache_ptr,
                 block_tables_ptr, seq, kvg, bt_stride, cache_kv_stride, block_size, scale_log2, offs_r, offs_d,
                 d_valid, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                 KV_PER_PROG: tl.constexpr, ONE_BLOCK: tl.constexpr, KV_FP8: tl.constexpr, KEYS_FIRST: tl.constexpr,
                 IEEE: tl.constexpr, CAUSAL: tl.constexpr):
    """The online softmax of the query rows over keys ``[kv_begin, kv_end)``, on from
    ``(acc, m_i, l_i)``. CAUSAL: mask keys past each row's position or the range's end
    (else every key of the range is visible to every row, and no score is masked but
    those of other KV heads' rows)."""
    r_tok = offs_r // KV_PER_PROG
    r_kv = offs_r % KV_PER_PROG
    for start_n in range(kv_begin, kv_end, BLOCK_N):
        offs_n = start_n + r_tok
        n_valid = offs_n < kv_end
        slot = _cache_slots(block_tables_ptr, seq, bt_stride, block_size, start_n, offs_n, n_valid, ONE_BLOCK)
        kv_off = (slot * NUM_KV_HEADS + kvg * KV_PER_PROG + r_kv) * HEAD_DIM
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k = tl.load(cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        if KV_FP8 == 1:
            k = k.to(q_ptr.dtype.element_ty)
        elif KV_FP8 == 2:
            k = k.to(tl.float16)
        if KEYS_FIRST:
            # Scores transposed, [key rows, query rows]: the key tile is the dot's
            # first operand, loaded (and converted) as it lies, with no transpose.
            if IEEE:
                s_t = tl.dot(k, q_t, input_precision="ieee")
            else:
                s_t = tl.dot(k, q_t)
            if KV_FP8 == 3:
                s_t = s_t * q_scale[None, :]
            s_t = s_t * scale_log2
            if CAUSAL:
                visible_t = (offs_n[:, None] <= q_pos[None, :]) & n_valid[:, None]
                if KV_PER_PROG > 1:
                    visible_t = visible_t & (r_kv[:, None] == m_kv[None, :])
                s_t = tl.where(visible_t, s_t, float("-inf"))
            elif KV_PER_PROG > 1:
                s_t = tl.where(r_kv[:, None] == m_kv[None, :], s_t, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s_t, 0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.trans(tl.exp2(s_t - m_safe[None, :]))
        else:
            if IEEE:
                qk = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                qk = tl.dot(q, tl.trans(k))
            qk = qk * scale_log2
            if CAUSAL:
                visible = (offs_n[None, :] <= q_pos[:, None]) & n_valid[None, :]
                if KV_PER_PROG > 1:
                    visible = visible & (r_kv[None, :] == m_kv[:, None])
                qk = tl.where(visible, qk, float("-inf"))
            elif KV_PER_PROG > 1:
                qk = tl.where(r_kv[None, :] == m_kv[:, None], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # A row that has seen no key yet keeps m = -inf; exp2 of (-inf) - 0 is 0.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(cache_ptr + cache_kv_stride + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        if KV_FP8 == 1 or KV_FP8 == 3:
            v = v.to(q_ptr.dtype.element_ty)
        elif KV_FP8 == 2:
            v = v.to(tl.float16)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def paged_attention_kernel(
    q_ptr, out_ptr, cache_ptr, block_tables_ptr, seq_lens_ptr, qsl_ptr, seq_order_ptr,
    part_acc_ptr, part_ml_ptr,
    scale_log2, v_scale,
    q_stride_t, q_stride_h, o_stride_t, o_stride_h,
    bt_stride, cache_kv_stride, block_size,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    KV_PER_PROG: tl.constexpr, ONE_BLOCK: tl.constexpr, KV_FP8: tl.constexpr, KEYS_FIRST: tl.constexpr,
    NUM_SPLITS: tl.constexpr, IEEE: tl.constexpr, HEADS_FAST: tl.constexpr = False, PDL: tl.constexpr = False,
    SPLIT_CAUSAL: tl.constexpr = False, ORDERED: tl.constexpr = False,
):
    pdl_enter(PDL)
    seq, kvg, tile = _grid_ids(HEADS_FAST)
    if ORDERED:
        # The grid's sequence axis walks the sequences in the order given (longest first).
        seq = tl.load(seq_order_ptr + seq)
    # With splits the second grid axis indexes the split (decode: one query tile).
    qblk = tile if NUM_SPLITS == 1 else 0
    split = tile if NUM_SPLITS > 1 else 0
    ROWS_PER_TOK: tl.constexpr = KV_PER_PROG * GROUP
    KV_ROWS: tl.constexpr = BLOCK_N * KV_PER_PROG

    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    if qblk * BLOCK_Q < q_len:
        ctx_len = seq_len - q_len
        offs_m = tl.arange(0, BLOCK_M)
        tok = qblk * BLOCK_Q + offs_m // ROWS_PER_TOK
        head = kvg * ROWS_PER_TOK + offs_m % ROWS_PER_TOK
        m_kv = (offs_m % ROWS_PER_TOK) // GROUP  # the row's KV head within the group
        m_valid = (offs_m < BLOCK_Q * ROWS_PER_TOK) & (tok < q_len)
        offs_d = tl.arange(0, BLOCK_D)
        d_valid = offs_d < HEAD_DIM
        q = tl.load(
            q_ptr + (q_start + tok)[:, None] * q_stride_t + head[:, None] * q_stride_h + offs_d[None, :],
            mask=m_valid[:, None] & d_valid[None, :], other=0.0,
        )
        if KV_FP8 == 2:
            # Queries beyond float16's range would become inf; real ones are far below it.
            q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        if KV_FP8 == 3:
            # Each query row in e4m3 with its own scale (448: e4m3's largest), restored on
            # the scores.
            q32 = q.to(tl.float32)
            q_amax = tl.max(tl.abs(q32), 1)
            q_scale = tl.where(q_amax > 0, q_amax / 448.0, 1.0)
            q = (q32 / q_scale[:, None]).to(tl.float8e4nv)
        q_pos = ctx_len + tok
        # Keys this tile can see: up to its last query's position.
        kv_end = tl.minimum(seq_len, ctx_len + (qblk + 1) * BLOCK_Q)
        kv_begin = 0
        if NUM_SPLITS > 1:
            kv_begin, kv_end = _split_range(kv_end, split, NUM_SPLITS, BLOCK_N)

        q_t = q
        if KEYS_FIRST:
            q_t = tl.trans(q)
        if KV_FP8 != 3:
            q_scale = tl.full([BLOCK_M], 1.0, tl.float32)
        offs_r = tl.arange(0, KV_ROWS)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        causal_begin = kv_begin
        if SPLIT_CAUSAL:
            # Keys before the tile's first query position are visible to every query row
            # (and inside the sequence): whole key tiles of them need no mask.
            causal_begin = tl.maximum(kv_begin, tl.minimum(kv_end, (ctx_len + qblk * BLOCK_Q) // BLOCK_N * BLOCK_N))
            acc, m_i, l_i = _attend_keys(
                acc, m_i, l_i, q, q_t, q_scale, q_pos, m_kv, kv_begin, causal_begin, q_ptr, cache_ptr,
                block_tables_ptr, seq, kvg, bt_stride, cache_kv_stride, block_size, scale_log2, offs_r, offs_d,
                d_valid, NUM_KV_HEADS, HEAD_DIM, BLOCK_N, KV_PER_PROG, ONE_BLOCK, KV_FP8, KEYS_FIRST, IEEE,
                False)
        acc, m_i, l_i = _attend_keys(
            acc, m_i, l_i, q, q_t, q_scale, q_pos, m_kv, causal_begin, kv_end, q_ptr, cache_ptr,
            block_tables_ptr, seq, kvg, bt_stride, cache_kv_stride, block_size, scale_log2, offs_r, offs_d,
            d_valid, NUM_KV_HEADS, HEAD_DIM, BLOCK_N, KV_PER_PROG, ONE_BLOCK, KV_FP8, KEYS_FIRST, IEEE,
            True)
        if KV_FP8 != 0:
            acc = acc * v_scale

        if NUM_SPLITS == 1:
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(
                out_ptr + (q_start + tok)[:, None] * o_stride_t + head[:, None] * o_stride_h + offs_d[None, :],
                out.to(out_ptr.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :],
            )
        else:
            _store_partials(part_acc_ptr, part_ml_ptr, seq, split, head, acc, m_i, l_i, m_valid, offs_d, d_valid,
                            NUM_SPLITS, NUM_KV_HEADS * GROUP, HEAD_DIM)


@triton.jit
def combine_splits_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr, qsl_ptr, o_stride_t, o_stride_h,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    if q_len > 0:
        offs_s = tl.arange(0, BLOCK_S)
        s_valid = offs_s < NUM_SPLITS
        row = (seq * NUM_SPLITS + offs_s) * NUM_HEADS + head
        m = tl.load(part_ml_ptr + row * 2, mask=s_valid, other=float("-inf"))
        l = tl.load(part_ml_ptr + row * 2 + 1, mask=s_valid, other=0.0)
        m_max = tl.max(m, 0)
        # Splits past the context saw no key: m = -inf, weight 0.
        w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_max))
        offs_d = tl.arange(0, BLOCK_D)
        d_valid = offs_d < HEAD_DIM
        acc = tl.load(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
                      mask=s_valid[:, None] & d_valid[None, :], other=0.0)
        total = tl.sum(acc * w[:, None], 0)
        denom = tl.sum(l * w, 0)
        out = total / tl.where(denom > 0, denom, 1.0)
        tl.store(out_ptr + q_start * o_stride_t + head * o_stride_h + offs_d,
                 out.to(out_ptr.dtype.element_ty), mask=d_valid)
