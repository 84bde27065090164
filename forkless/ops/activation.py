"""SiLU-and-mul (custom op ``silu_and_mul``): the gate of a SwiGLU feed-forward block.

Invariants: as for :mod:`forkless.ops.layernorm`, ``forward_cpu`` takes float32 or bfloat16
and ``forward_cuda`` CUDA tensors only; anything else runs ``forward_native``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from forkless.ops.interface import CustomOp
from forkless.ops import fused_cpu
from forkless.ops.kernels import FusedKernelOp, triton_kernels


@CustomOp.register("silu_and_mul")
class SiluAndMul(FusedKernelOp):
    """``silu(gate) * up`` for a fused ``[..., 2 * d]`` gate/up projection (gate first)."""

    def __init__(self) -> None:
        super().__init__()

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        # In place on silu's fresh output: one [tokens, d] temporary less per layer.
        return F.silu(gate).mul_(up)

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in fused_cpu.DTYPES:
            return self.forward_native(x)
        return fused_cpu.silu_and_mul(x)

    def forward_cuda(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return self.forward_native(x)
        return triton_kernels().silu_and_mul(x)
