"""The Triton argmax (batch-1 decode's greedy sampling on CUDA) gives ``torch.argmax``'s
indices, on the CPU under Triton's interpreter; ``tests/sample/test_cuda.py`` runs the same
cases on a GPU through ``row_argmax``."""

from __future__ import annotations

from tests.triton_interpreter import needs_triton, run_interpreted

_SCRIPT = """
import sys
sys.path.insert(0, "tests/sample")
from argmax_cases import cases
from forkless.sample.argmax_triton import argmax_rows

n = 0
for x in cases("cpu"):
    for rows in (1, 3, 8):
        got, want = argmax_rows(x[:rows]).tolist(), x[:rows].argmax(dim=-1).tolist()
        assert got == want, (x.dtype, x.shape, rows, got, want)
        n += 1
    # Rows of a wider tensor, as the draft model's vocabulary slice of its logits.
    part = x[:4, : x.shape[1] - 5]
    assert argmax_rows(part).tolist() == part.argmax(dim=-1).tolist(), (x.dtype, x.shape)
    n += 1
print("argmax ok", n)
"""


@needs_triton
def test_triton_argmax_under_the_interpreter() -> None:
    run_interpreted(_SCRIPT, "argmax ok 48")
