"""A Triton GEMV for one-row products (batch-1 decode), launched with programmatic
dependent launch where the GPU has it.

At one row a linear layer reads its whole weight to produce a few thousand values: the
kernel is a stream over the weight at memory bandwidth, and what separates it from the
bandwidth is the start and end of each launch (the memory pipe filling and draining, some
microseconds each, 128 launches a token for Llama-3-8B's four projections). On Hopper a
kernel launched with programmatic dependent launch (PDL) may start while the kernel
before it is still running: each program here requests its first weight tile, lets the
next kernel launch (``gdc_launch_dependents``), and only then waits for the kernel before
(``gdc_wait``) to read its input. The weights never depend on the kernel before, so the
next projection's weight reads overlap this one's tail. Measured on an H200 over
Llama-3-8B's 32 layers of projections in one CUDA graph (`benchmarks/README.md`): cuBLAS
3.81 ms, this kernel 3.53 ms, with PDL 3.39 ms, against 3.27 ms at the copy bandwidth;
batch-1 decode of that shape 4.53 -> 4.25 ms a token.

Invariants:
    * Sums run in float32 over ``BLOCK_K`` columns at a time and round once to the
      output dtype, as a cuBLAS half-precision GEMM does (in another order: results
      match ``F.linear`` to rounding, not bit for bit).
    * Every read of the input happens after ``gdc_wait``: a kernel launched with PDL
      never sees its input before the kernel that writes it has finished. A kernel after
      this one that is launched without PDL waits for it as usual.
    * With ``act`` the input is ``[gate | up]`` (``2 * K`` values) and the product is
      taken with ``silu(gate) * up``, rounded to the input dtype first, as the separate
      SiLU-and-mul kernel would.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from forkless.triton_utils.pdl import use_pdl

#: Rows of the weight per program and columns per step: the best of a sweep on an H200
#: (8 x 1024 with 8 warps; 16-row programs were 5 % slower, 4 warps 6 %).
BLOCK_N = 8
BLOCK_K = 1024
NUM_WARPS = 8


@triton.jit
def _input_block(x_ptr, k0, cols, K: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr):
    if EVEN_K:
        x = tl.load(x_ptr + k0 + cols)
    else:
        x = tl.load(x_ptr + k0 + cols, mask=k0 + cols < K, other=0.0)
    if ACT:
        if EVEN_K:
            up = tl.load(x_ptr + K + k0 + cols)
        else:
            up = tl.load(x_ptr + K + k0 + cols, mask=k0 + cols < K, other=0.0)
        g = x.to(tl.float32)
        # SiLU then the product, each rounded to the input dtype as SiluAndMul rounds.
        silu = (g / (1.0 + tl.exp(-g))).to(x.dtype)
        x = (silu.to(tl.float32) * up.to(tl.float32)).to(x.dtype)
    return x.to(tl.float32)


@triton.jit
def _weight_tile(w_ptrs, k0, rows_ok, cols, K: tl.constexpr, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(w_ptrs + k0)
    return tl.load(w_ptrs + k0, mask=rows_ok[:, None] & (k0 + cols[None, :] < K), other=0.0)


@triton.jit
def _gemv_kernel(w_ptr, x_ptr, b_ptr, y_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 ACT: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr, EVEN_N: tl.constexpr,
                 EVEN_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :]
    row_ok = rows < N
    w = _weight_tile(w_ptrs, 0, row_ok, cols, K, EVEN_N and EVEN_K)
    if PDL:
        # The first weight tile is requested: let the next kernel start its own, then
        # wait for the kernel before to have written this one's input.
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.sum(w.to(tl.float32) * _input_block(x_ptr, 0, cols, K, ACT, EVEN_K)[None, :], axis=1)
    for k0 in tl.range(BLOCK_K, K, BLOCK_K):
        w = _weight_tile(w_ptrs, k0, row_ok, cols, K, EVEN_N and EVEN_K)
        acc += tl.sum(w.to(tl.float32) * _input_block(x_ptr, k0, cols, K, ACT, EVEN_K)[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=row_ok)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, act: bool = False) -> torch.Tensor:
    """``x @ weight.T + bias`` for one row, one launch.

    Args:
        x: ``K`` contiguous values (``2 * K`` with ``act``: gate then up) on the weight's
            device, of its dtype.
        weight: ``[N, K]`` contiguous.
        bias: ``[N]`` or None.
        act: Multiply by ``silu(gate) * up`` instead of ``x``.

    Returns:
        ``[1, N]`` of the weight's dtype.
    """
    n, k = weight.shape
    y = torch.empty((1, n), dtype=weight.dtype, device=weight.device)
    block_k = min(BLOCK_K, triton.next_power_of_2(k))
    pdl = use_pdl(weight.device, 1)
    _gemv_kernel[(triton.cdiv(n, BLOCK_N),)](
        weight, x, bias if bias is not None else weight, y, n, K=k, BLOCK_N=BLOCK_N, BLOCK_K=block_k, ACT=act,
        HAS_BIAS=bias is not None, PDL=pdl, EVEN_N=n % BLOCK_N == 0, EVEN_K=k % block_k == 0,
        num_warps=NUM_WARPS, num_stages=1, launch_pdl=pdl)
    return y
