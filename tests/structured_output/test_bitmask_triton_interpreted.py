"""The Triton bitmask kernel (forkless.structured_output.bitmask_triton) on the CPU, under
Triton's interpreter: CI has no GPU, where ``tests/gpu/test_structured_output_cuda.py``
compares it with the CPU's unpacking. Here the same comparison runs in a child process
(the variable must be set before Triton is imported): rows in order and mapped, a bitmask
narrower than the vocabulary (the tokens past it disallowed), a vocabulary that is not a
multiple of 32 or of the kernel's block."""

from __future__ import annotations

from tests.triton_interpreter import needs_triton, run_interpreted

_SCRIPT = """
import numpy as np, torch
from forkless.structured_output.bitmask import apply_token_bitmask
from forkless.structured_output.bitmask_triton import apply_bitmask_cuda
gen = np.random.default_rng(0)
cases = [(1000, 32, 5, None), (1000, 30, 5, [4, 0, 7, 2, 9]), (5000, 157, 3, [1, 2, 3]), (4100, 129, 10, None)]
for vocab, words, n, rows in cases:
    logits = torch.randn(10, vocab)
    bitmask = gen.integers(-2**31, 2**31, size=(n, words), dtype=np.int64).astype(np.int32)
    want = logits.clone()
    apply_token_bitmask(want, bitmask, rows)  # the CPU's numpy unpacking
    got = logits.clone()
    apply_bitmask_cuda(got, torch.from_numpy(bitmask), rows)
    assert torch.equal(got, want), (vocab, words, rows)
    assert torch.isinf(want).any() and not torch.isinf(want).all()
print("bitmask ok")
"""


@needs_triton
def test_bitmask_kernel_under_the_interpreter() -> None:
    run_interpreted(_SCRIPT, "bitmask ok")
