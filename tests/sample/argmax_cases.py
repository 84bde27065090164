"""Rows that tell ``torch.argmax``'s rules apart, for the Triton argmax's checks (on the
GPU and under Triton's interpreter)."""

from __future__ import annotations

import torch


def cases(device: str) -> list[torch.Tensor]:
    """``[rows, V]`` batches: ties across chunks, NaNs, infinities, all ``-inf``, widths
    that are and are not a multiple of the kernel's chunk, three dtypes."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for width in (8192, 10_000, 128_256, 151_936):
        x = torch.zeros(9, width)
        x[0, 100] = x[0, width - 3] = 1.0  # tie in two chunks: the first wins
        x[1, 4095] = x[1, 4096] = 2.0  # tie on a chunk's edge
        x[2, width - 1] = float("nan")
        x[2, 9] = float("inf")  # the NaN wins though it comes later
        x[3, 7000] = x[3, 5000] = float("nan")  # the first NaN, in the second chunk
        x[4] = float("-inf")  # all equal: index 0
        x[5, -1] = float("inf")
        x[6] = torch.randn(width, generator=gen)
        x[7] = torch.randint(0, 3, (width,), generator=gen).float()  # many ties
        x[8] = torch.randn(width, generator=gen)  # a ninth row: past FEW_ROWS
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            out.append(x.to(dtype).to(device))
    return out
