"""row_argmax gives argmax(dim=-1)'s indices: the first on ties, a NaN counted largest."""

from __future__ import annotations

import pytest
import torch

from forkless import cpu_kernels
from forkless.sample.argmax import row_argmax

from argmax_cases import cases


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


@pytest.mark.parametrize("level", [level for level in cpu_kernels.ISA_LEVELS if level in cpu_kernels.supported_isas()])
def test_cpu_kernel_argmax_equals_argmax_at_every_isa_level(level, monkeypatch):
    """The C kernel (float32 rows) at each level this CPU runs: the Triton argmax's cases
    (ties across and on chunk edges, NaNs after infinities, all -inf), widths below, at
    and off the vector width, rows that are not contiguous with each other."""
    lib = cpu_kernels.load_isa(level)
    if lib is None:
        pytest.skip(f"the {level} kernels could not be built here (no C compiler)")
    monkeypatch.setattr(cpu_kernels, "load", lambda: lib)
    gen = torch.Generator().manual_seed(1)
    batches = [x for x in cases("cpu") if x.dtype == torch.float32]
    for width in (1, 7, 8, 16, 17, 100_003):
        x = torch.randn(4, width + 3, generator=gen)[:, :width]  # rows width + 3 apart
        x[1, width // 2] = float("nan")
        x[2] = torch.randint(0, 2, (width,), generator=gen).float()
        batches.append(x)
    for x in batches:
        assert torch.equal(row_argmax(x), x.argmax(dim=-1)), (level, x.shape)
