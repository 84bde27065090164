"""The argmax of a few long rows on the GPU, in two launches that use the whole GPU.

``torch.argmax(dim=-1)`` over one row of a 128,256-token vocabulary took 38 us on an H200
(the batch-1 decode profile, `benchmarks/README.md`): with a single output, ATen's
reduction leaves most of the GPU idle. Here the first launch splits each row into chunks
of ``BLOCK`` values, one program a chunk, each writing its chunk's largest value and
where it is; the second reduces each row's chunks in one program.

Invariants:
    * The result is ``torch.argmax``'s: the first index of the largest value, a NaN
      counted larger than everything (the first NaN wins), a row of ``-inf`` gives 0.
      Chunks are reduced in order and each keeps its first maximum, so ties resolve to
      the lowest index across chunks too.
    * Values are compared in float32, which holds every bfloat16 and float16 value
      exactly (the order and the ties of the input's dtype are kept).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Values per first-stage program: 32 programs for a 128k vocabulary a row.
BLOCK = 4096


@triton.jit
def _chunk_argmax_kernel(x_ptr, val_ptr, idx_ptr, nan_ptr, V, stride_row, NUM_CHUNKS,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    nan = x != x
    has_nan = tl.max(nan.to(tl.int32), 0)
    first_nan = tl.min(tl.where(nan, offs, V), 0)
    clean = tl.where(nan, float("-inf"), x)
    best = tl.argmax(clean, 0, tie_break_left=True)
    out = row * NUM_CHUNKS + chunk
    tl.store(val_ptr + out, tl.max(clean, 0))
    tl.store(idx_ptr + out, tl.where(has_nan > 0, first_nan, chunk * BLOCK + best).to(tl.int64))
    tl.store(nan_ptr + out, has_nan)


@triton.jit
def _row_argmax_kernel(val_ptr, idx_ptr, nan_ptr, out_ptr, V, NUM_CHUNKS, BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK_C)
    valid = c < NUM_CHUNKS
    base = row * NUM_CHUNKS
    vals = tl.load(val_ptr + base + c, mask=valid, other=float("-inf"))
    idxs = tl.load(idx_ptr + base + c, mask=valid, other=0)
    nans = tl.load(nan_ptr + base + c, mask=valid, other=0)
    best = tl.argmax(vals, 0, tie_break_left=True)
    found = tl.sum(tl.where(c == best, idxs, 0), 0)
    # A NaN anywhere: the first one (chunks in order, each holding its own first).
    first_nan = tl.min(tl.where(nans > 0, idxs, V), 0)
    tl.store(out_ptr + row, tl.where(tl.max(nans, 0) > 0, first_nan, found))


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of a 2-D CUDA tensor whose last dimension is contiguous.

    Args:
        x: ``[rows, V]`` float32, bfloat16 or float16 on a CUDA device.

    Returns:
        ``[rows]`` int64 indices.
    """
    rows, v = x.shape
    chunks = triton.cdiv(v, BLOCK)
    vals = torch.empty(rows * chunks, dtype=torch.float32, device=x.device)
    idxs = torch.empty(rows * chunks, dtype=torch.int64, device=x.device)
    nans = torch.empty(rows * chunks, dtype=torch.int32, device=x.device)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    _chunk_argmax_kernel[(rows, chunks)](x, vals, idxs, nans, v, x.stride(0), chunks,
                                         BLOCK=BLOCK, num_warps=8)
    _row_argmax_kernel[(rows,)](vals, idxs, nans, out, v, chunks,
                                BLOCK_C=max(16, triton.next_power_of_2(chunks)), num_warps=1)
    return out
