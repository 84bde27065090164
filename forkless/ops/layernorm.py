"""RMSNorm (custom op ``rms_norm``), computed in float32 like the Hugging Face reference.

Invariants: ``forward_cpu`` runs the C kernel on float32 or bfloat16 input whose weight
(and residual) has the same dtype (anything else takes ``forward_native``);
``forward_cuda`` runs the Triton kernel on CUDA tensors (a CPU tensor
in a CUDA process, e.g. a test's reference, takes ``forward_native``). Every
implementation returns what ``forward_native`` returns, to float32 rounding (bfloat16: where
a sum taken in another order tips a rounding, one bfloat16 step).
"""

from __future__ import annotations

import torch
from torch import nn

from forkless.ops.interface import CustomOp
from forkless.ops import fused_cpu
from forkless.ops.kernels import FusedKernelOp, triton_kernels


@CustomOp.register("rms_norm")
class RMSNorm(FusedKernelOp):
    """Root-mean-square layer norm with an optional fused residual add.

    ``forward(x, residual=None)`` normalises ``x`` (``[..., hidden]``), or ``x + residual``
    when a residual stream is given (pre-norm decoder layers); with ``residual`` it
    returns ``(normalised, x + residual)`` so the caller carries the updated stream on.

    Args:
        hidden_size: Size of the normalised (last) dimension.
        eps: Added to the mean square before the reciprocal square root.
        dtype: Parameter dtype.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # float32 statistics: in half precision the mean square overflows or loses digits.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        # x32 is a fresh tensor (x itself may be the residual stream): scale it in place.
        return x32.to(x.dtype).mul_(self.weight)

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x

    def forward_cpu(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if x.dtype not in fused_cpu.DTYPES or self.weight.dtype != x.dtype or (
                residual is not None and residual.dtype != x.dtype):
            return self.forward_native(x, residual)
        out, summed = fused_cpu.rms_norm(x, self.weight, self.eps, residual)
        return out if residual is None else (out, summed)

    def forward_cuda(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if not x.is_cuda:
            return self.forward_native(x, residual)
        out, summed = triton_kernels().rms_norm(x, self.weight, self.eps, residual)
        return out if residual is None else (out, summed)
