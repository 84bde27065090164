"""Buffers the fused kernels read and write, shared by the Triton and the C versions.

Its own module so that neither kernel module imports the other (``fused_triton`` imports
Triton, which a CPU process may not have).
"""

from __future__ import annotations

import torch


def rms_norm_buffers(
    x: torch.Tensor, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """What a fused RMSNorm kernel reads and writes, shared by the Triton and C versions.

    Args:
        x: ``[T, N]`` or ``[T, H, N]``.
        residual: ``[T, N]`` or None.

    Returns:
        ``(x3, residual, out, res_out)``: ``x`` as ``[T, H, N]`` and ``residual`` with
        their last dimension contiguous; the fresh ``[T, H, N]`` output and, with a
        residual, the fresh ``[T, N]`` for ``x + residual`` (else None).
    """
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    t, h, n = x3.shape
    out = torch.empty((t, h, n), dtype=x.dtype, device=x.device)
    res_out = None
    if residual is not None:
        if residual.stride(-1) != 1:
            residual = residual.contiguous()
        res_out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    return x3, residual, out, res_out
