"""row_argmax gives argmax(dim=-1)'s indices: the first on ties, a NaN counted largest."""

from __future__ import annotations

import torch

from forkless.sample.argmax import row_argmax


def test_row_argmax_equals_argmax_with_ties_nans_and_infinities():
    x = torch.zeros(5, 4096)
    x[0, 100] = x[0, 3000] = 1.0  # tie: the first wins
    x[2, 7] = x[2, 9] = float("nan")  # a NaN is the largest, the first one
    x[3, -1] = x[3, 5] = float("inf")
    x[4] = float("-inf")  # all equal: index 0
    assert row_argmax(x).tolist() == x.argmax(dim=-1).tolist() == [100, 0, 7, 5, 0]
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        y = torch.randint(0, 4, (3, 37, 4096), generator=gen).to(dtype)  # many ties, 3-D as the rejection sampler's
        assert torch.equal(row_argmax(y), y.argmax(dim=-1))
