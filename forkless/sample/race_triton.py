"""A batch's rows sampled at their temperatures in one pass over the logits, on the GPU.

The sampler draws a random row's token by an exponential race, ``argmax(p / q)`` with
``p = softmax(logits / T)`` and ``q ~ Exp(1)`` per vocabulary entry. Run as PyTorch ops
that is a float32 copy of the logits, the division by ``T``, a softmax, a tensor of noise,
a division and an argmax: about 3.3 GB of memory traffic a step at 512 rows of a
151,936-token vocabulary, ~1 ms on an H100, for a decode step of ~15 ms. Here each row's
race runs where its logits are read, once: ``argmax(p / q) = argmax(logits / T - log q)``
(the softmax's normaliser is the same for the whole row and ``log`` keeps the order), the
noise drawn in the kernel from Philox counters. A first launch reduces chunks of
``BLOCK`` entries to their winner, a second each row's chunks (``argmax_triton``'s).

Which steps come here is :meth:`forkless.sample.sampler.Sampler.races_in_one_pass`'s
rule: rows that need only their temperature (no top-k, top-p, penalties, logprobs,
active logits processors or per-request seeds).

Invariants:
    * A random row's token has the distribution of the sampler's PyTorch race on CUDA:
      ``q = -log(1 - u)`` from float32 uniforms ``u`` in [0, 1) (as ``exponential_`` draws
      them), clamped to the smallest normal float32 so that ``log q`` is finite.
    * A greedy row (temperature below ``SAMPLING_EPS``) takes ``torch.argmax``'s index of
      its logits: no noise, the first index of the largest value, the first NaN if any.
      A random row with a NaN logit takes its first NaN too (argmax's rule).
    * One ``seed`` (and ``block``) gives one draw: the noise of an entry depends on them
      and its place alone. Each call takes a new seed from torch's default CPU generator
      (so ``--seed`` fixes the run).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from forkless.sample.argmax_triton import BLOCK, _row_argmax_kernel
from forkless.sampling_params import SAMPLING_EPS

#: The largest ``rows * V`` the kernel's 32-bit indices and Philox counters cover.
MAX_ENTRIES = 2**31 - 1
_TINY = torch.finfo(torch.float32).tiny


@triton.jit
def _quarter_race(x_row_ptr, offs, u, V, scale, greedy, TINY: tl.constexpr):
    """A quarter of a chunk: its best key, the first index holding it, whether it has a
    NaN logit, and the first one."""
    inside = offs < V
    x = tl.load(x_row_ptr + offs, mask=inside, other=float("-inf")).to(tl.float32)
    nan = x != x
    q = tl.maximum(-tl.log(1.0 - u), TINY)
    key = tl.where(nan | (offs >= V), float("-inf"), x * scale - tl.where(greedy, 0.0, tl.log(q)))
    best = tl.max(key, 0)
    return best, tl.min(tl.where(key == best, offs, V), 0), tl.max(nan.to(tl.int32), 0), tl.min(tl.where(nan, offs, V), 0)


@triton.jit
def _later_quarter(val, idx, has_nan, first_nan, x_row_ptr, offs, u, V, scale, greedy, TINY: tl.constexpr):
    """Fold the next quarter (higher indices) in: it wins only with a strictly larger key."""
    v, i, n, f = _quarter_race(x_row_ptr, offs, u, V, scale, greedy, TINY)
    take = v > val
    return tl.where(take, v, val), tl.where(take, i, idx), tl.maximum(has_nan, n), tl.minimum(first_nan, f)


@triton.jit
def _chunk_race_kernel(x_ptr, temp_ptr, val_ptr, idx_ptr, nan_ptr, seed, V, stride_row, NUM_CHUNKS,
                       EPS: tl.constexpr, TINY: tl.constexpr, BLOCK: tl.constexpr):
    # A chunk is four quarters in index order, whose noise comes from one Philox call per
    # four entries (rand4x): generating the noise is most of the kernel's arithmetic.
    QUARTER: tl.constexpr = BLOCK // 4
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    t = tl.load(temp_ptr + row)
    greedy = t < EPS
    scale = tl.where(greedy, 1.0, 1.0 / tl.where(greedy, 1.0, t))
    sub = tl.arange(0, QUARTER)
    u0, u1, u2, u3 = tl.rand4x(seed, (row * NUM_CHUNKS + chunk) * QUARTER + sub)
    x_row = x_ptr + row * stride_row
    base = chunk * BLOCK
    val, idx, has_nan, first_nan = _quarter_race(x_row, base + sub, u0, V, scale, greedy, TINY)
    val, idx, has_nan, first_nan = _later_quarter(val, idx, has_nan, first_nan, x_row, base + QUARTER + sub, u1,
                                                  V, scale, greedy, TINY)
    val, idx, has_nan, first_nan = _later_quarter(val, idx, has_nan, first_nan, x_row, base + 2 * QUARTER + sub,
                                                  u2, V, scale, greedy, TINY)
    val, idx, has_nan, first_nan = _later_quarter(val, idx, has_nan, first_nan, x_row, base + 3 * QUARTER + sub,
                                                  u3, V, scale, greedy, TINY)
    out = row * NUM_CHUNKS + chunk
    tl.store(val_ptr + out, val)
    tl.store(idx_ptr + out, tl.where(has_nan > 0, first_nan, idx).to(tl.int64))
    tl.store(nan_ptr + out, has_nan)


def race_rows(logits: torch.Tensor, temperature: torch.Tensor, seed: int | None = None,
              block: int = BLOCK) -> torch.Tensor:
    """One token per row: a draw from ``softmax(logits / T)``, or the argmax where ``T`` is
    below ``SAMPLING_EPS``.

    Args:
        logits: ``[rows, V]`` float32, bfloat16 or float16 on a CUDA device (Triton's
            interpreter: the CPU), the last dimension contiguous, ``rows * V`` at most
            :data:`MAX_ENTRIES`. Not modified.
        temperature: ``[rows]`` float32 on the same device.
        seed: The noise's seed; ``None``: drawn from torch's default CPU generator.
        block: Entries per first-launch program (a power of two, at least 4; small ones
            keep the interpreter's tests short).

    Returns:
        ``[rows]`` int64 token ids.
    """
    rows, v = logits.shape
    if rows * v > MAX_ENTRIES:
        raise ValueError(f"race_rows takes at most {MAX_ENTRIES} logits, got {rows} x {v}")
    if seed is None:
        seed = int(torch.randint(MAX_ENTRIES, (1,)).item())
    chunks = triton.cdiv(v, block)
    vals = torch.empty(rows * chunks, dtype=torch.float32, device=logits.device)
    idxs = torch.empty(rows * chunks, dtype=torch.int64, device=logits.device)
    nans = torch.empty(rows * chunks, dtype=torch.int32, device=logits.device)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    _chunk_race_kernel[(rows, chunks)](logits, temperature, vals, idxs, nans, seed, v, logits.stride(0), chunks,
                                       EPS=SAMPLING_EPS, TINY=_TINY, BLOCK=block, num_warps=8)
    _row_argmax_kernel[(rows,)](vals, idxs, nans, out, v, chunks,
                                BLOCK_C=max(16, triton.next_power_of_2(chunks)), num_warps=1)
    return out


__all__ = ["MAX_ENTRIES", "race_rows"]
