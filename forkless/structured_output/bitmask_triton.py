"""The packed grammar bitmask applied to CUDA logits in one Triton kernel.

Unpacking with tensor ops (shift, and, compare, then ``masked_fill_``) materialises the
bits as int32 and bool tensors 32 and 8 times the bitmask's size and reads and writes the
logits once more: at 256 rows of a 151,936-token vocabulary ~0.9 GB of device traffic and
five launches a step. Here each program reads its tokens' words and writes ``-inf`` only
where a token is disallowed: the bitmask (4.9 MB) read once, the logits never read.

Invariants (those of :mod:`forkless.structured_output.bitmask`):
    * Bitmask row ``i`` masks logits row ``rows[i]`` (row ``i`` without ``rows``); other
      rows are untouched.
    * Token ``t`` is allowed where bit ``t % 32`` of word ``t // 32`` is set; token ids past
      the bitmask's width are disallowed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from forkless.utils.torch_utils import async_tensor_h2d

#: Tokens per program (151,936 / 4,096: 38 programs a row).
BLOCK = 4096


@triton.jit
def _apply_bitmask_kernel(logits_ptr, bitmask_ptr, rows_ptr, logits_stride, words, vocab,
                          BLOCK: tl.constexpr, HAS_ROWS: tl.constexpr):
    r = tl.program_id(0)
    if HAS_ROWS:
        row = tl.load(rows_ptr + r).to(tl.int64)
    else:
        row = r.to(tl.int64)
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = tokens < vocab
    word = tl.load(bitmask_ptr + r.to(tl.int64) * words + tokens // 32, mask=in_vocab & (tokens // 32 < words),
                   other=0)
    allowed = ((word >> (tokens % 32)) & 1) != 0
    minus_inf = tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * logits_stride + tokens, minus_inf, mask=in_vocab & (allowed == 0))


def apply_bitmask_cuda(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int] | None) -> None:
    """Set to ``-inf``, in place, the logits the bitmask disallows (one launch).

    Args:
        logits: ``[B, V]`` on a CUDA device, each row contiguous.
        bitmask: ``[n, words]`` int32 on the same device, contiguous.
        rows: The logits row of each bitmask row (``n`` of them), or None: row ``i``.
    """
    n, words = bitmask.shape
    if n == 0:
        return
    vocab = logits.shape[1]
    index = async_tensor_h2d(rows, torch.int32, logits.device, logits.is_cuda) if rows is not None else bitmask
    _apply_bitmask_kernel[(n, triton.cdiv(vocab, BLOCK))](
        logits, bitmask, index, logits.stride(0), words, vocab, BLOCK=BLOCK, HAS_ROWS=rows is not None,
        num_warps=4)
