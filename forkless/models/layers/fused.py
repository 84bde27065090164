"""Whether a layer runs a fused kernel (Triton on CUDA, C on the CPU) or its plain PyTorch ops."""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

import torch

from forkless import envs


@functools.lru_cache(maxsize=None)
def _fused_module() -> ModuleType | None:
    if not envs.FORKLESS_FUSED_KERNELS or importlib.util.find_spec("triton") is None:
        return None
    from forkless.models.layers import fused_triton

    return fused_triton


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


@functools.lru_cache(maxsize=None)
def _cpu_fused_module() -> ModuleType | None:
    from forkless import cpu_kernels

    if cpu_kernels.load() is None:
        return None
    from forkless.models.layers import fused_cpu

    return fused_cpu


def fused_ops(x: torch.Tensor) -> ModuleType | None:
    """The fused-kernel module for ``x``: one kernel per layer op instead of several.

    Args:
        x: The layer's input.

    Returns:
        :mod:`~forkless.models.layers.fused_triton` when ``x`` is on a CUDA device and
        Triton is installed; :mod:`~forkless.models.layers.fused_cpu` when ``x`` is a
        float32 CPU tensor and the CPU kernels are available; None otherwise, and
        whenever ``FORKLESS_FUSED_KERNELS`` is ``0`` (use PyTorch ops).
    """
    if x.is_cuda:
        return _fused_module()
    if x.dtype is torch.float32 and x.device.type == "cpu" and envs.FORKLESS_FUSED_KERNELS:
        return _cpu_fused_module()
    return None
