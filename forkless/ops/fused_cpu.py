"""The fused layer ops of :mod:`~forkless.ops.fused_triton`, on the CPU kernels.

Same functions, same signatures, float32 only (see ``forkless/cpu_kernels/csrc/layers.c``).
The built-in custom ops call them from ``forward_cpu`` (:mod:`forkless.ops.kernels` binds
that only where the kernels loaded).
"""

from __future__ import annotations

import torch

from forkless import cpu_kernels
from forkless.ops.fused_buffers import rms_norm_buffers


def _lib():
    lib = cpu_kernels.load()
    assert lib is not None, "fused_cpu is used only where the CPU kernels loaded"
    return lib


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm over the last dimension, after adding ``residual`` when given.

    Args:
        x: ``[T, N]`` or ``[T, H, N]`` (per-head norm); the last dimension contiguous.
        weight: ``[N]``.
        eps: Added to the mean square.
        residual: ``[T, N]``, only with a 2-D ``x``.

    Returns:
        ``(normalised, x + residual)``; the second item is None without a residual.
    """
    x3, residual, out, res_out = rms_norm_buffers(x, residual)
    t, h, n = x3.shape
    weight = weight.contiguous()
    _lib().forkless_rms_norm_f32(
        x3.data_ptr(), x3.stride(0), x3.stride(1),
        residual.data_ptr() if residual is not None else None,
        residual.stride(0) if residual is not None else 0,
        weight.data_ptr(), out.data_ptr(), res_out.data_ptr() if res_out is not None else None,
        t, h, n, eps)
    return (out if x.dim() == 3 else out.squeeze(1)), res_out


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            rotary_dim: int) -> None:
    """Rotate the first ``rotary_dim`` channels of every query and key head, in place.

    Args:
        q: ``[T, Hq, D]``, head dimension contiguous.
        k: ``[T, Hkv, D]``, same.
        cos: ``[T, 1, rotary_dim]`` (``cat(freqs, freqs).cos()``), dtype of ``q``.
        sin: Same shape, the sines.
        rotary_dim: Rotated channels per head (``D`` unless partial rotary).
    """
    if cos.stride(-1) != 1 or sin.stride(-1) != 1 or sin.stride(0) != cos.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    _lib().forkless_rotary_f32(
        q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
        cos.data_ptr(), sin.data_ptr(), cos.stride(0), q.shape[0], q.shape[1], k.shape[1], rotary_dim)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``x = [T, 2 * d]`` (gate first).

    Args:
        x: ``[T, 2 * d]``, last dimension contiguous.

    Returns:
        ``[T, d]``.
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    t, d = x.shape[0], x.shape[1] // 2
    out = torch.empty((t, d), dtype=torch.float32)
    _lib().forkless_silu_and_mul_f32(x.data_ptr(), x.stride(0), out.data_ptr(), t, d)
    return out
