"""Whether a layer runs its fused Triton kernel or its plain PyTorch ops."""

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


def fused_ops(x: torch.Tensor) -> ModuleType | None:
    """The fused-kernel module (:mod:`~forkless.models.layers.fused_triton`) for ``x``.

    Args:
        x: The layer's input.

    Returns:
        The module when ``x`` is on a CUDA device, Triton is installed and
        ``FORKLESS_FUSED_KERNELS`` is not ``0``; otherwise None (use PyTorch ops).
    """
    if not x.is_cuda:
        return None
    return _fused_module()
