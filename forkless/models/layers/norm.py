"""RMSNorm, computed in float32 like the Hugging Face reference implementations."""

from __future__ import annotations

import torch
from torch import nn

from forkless.models.layers.fused import fused_ops


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with an optional fused residual add.

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

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normalise ``x``, or ``x + residual`` when a residual is given.

        Args:
            x: ``[..., hidden]`` input.
            residual: Residual stream to add first (pre-norm decoder layers).

        Returns:
            The normalised tensor; with ``residual``, ``(normalised, x + residual)`` so
            the caller carries the updated residual stream on.
        """
        fused = fused_ops(x)
        if fused is not None:
            out, summed = fused.rms_norm(x, self.weight, self.eps, residual)
            return out if residual is None else (out, summed)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
