"""The index of each row's largest value, as ``argmax(dim=-1)`` gives it, faster on the
CPU and, for a few rows, on CUDA."""

from __future__ import annotations

import torch

from forkless import cpu_kernels
from forkless.triton_utils import triton_available

#: Up to this many rows a CUDA argmax runs as chunked Triton programs
#: (``argmax_triton``): with so few outputs ATen's reduction leaves the GPU mostly idle.
#: Measured on an H100 (bf16, in a CUDA graph; benchmarks/README.md): a 128,256-wide row
#: 3.7 against 26.3 us, 32 rows 8.4 against 27.4; 151,936 wide, 4.0 against 9.1 and 9.4
#: against 17.0 us.
FEW_ROWS = 32
#: Rows shorter than this stay with ATen (a vocabulary is far longer).
MIN_WIDTH = 8192
_HALF_OR_FLOAT = (torch.float32, torch.bfloat16, torch.float16)


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """The index of the largest value along the last dimension, the first one on ties
    (``x.argmax(dim=-1)``).

    On the CPU a float32 batch goes to the C kernels' ``forkless_row_argmax_f32`` where they
    loaded (``forkless/cpu_kernels/csrc/argmax.c``: one thread reads ``[35, 49152]`` in
    0.14 against torch's 0.9-1.1 ms on a Zen 5 EPYC); otherwise ``max(dim=-1)`` gives the
    same indices (first on ties, a NaN counted largest), faster than ``argmax`` on a
    2-core Xeon (torch 2.13, two threads, ``[35, 49152]``: 0.42 against 1.10 ms). On CUDA,
    a batch of up to ``FEW_ROWS`` rows of a vocabulary's width (batch-1 decode) goes to
    the two-launch Triton argmax, where Triton is installed.
    """
    if x.device.type == "cpu":
        if x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1 and x.shape[1] > 0:
            lib = cpu_kernels.load()
            if lib is not None:
                out = torch.empty(x.shape[0], dtype=torch.int64)
                lib.forkless_row_argmax_f32(x.data_ptr(), x.stride(0), out.data_ptr(), x.shape[0], x.shape[1])
                return out
        return x.max(dim=-1).indices
    if (x.device.type == "cuda" and x.dim() == 2 and 0 < x.shape[0] <= FEW_ROWS and x.shape[1] >= MIN_WIDTH
            and x.dtype in _HALF_OR_FLOAT and x.stride(1) == 1 and triton_available()):
        from forkless.sample.argmax_triton import argmax_rows

        return argmax_rows(x)
    return x.argmax(dim=-1)
