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
