"""Which of forkless's fused kernels this process can run, and the base of the ops that use them.

Invariants:
    * Each kernel module is looked for once per process: the C kernels
      (:mod:`forkless.ops.fused_cpu`, float32, built by :mod:`forkless.cpu_kernels`) and
      the Triton kernels (:mod:`forkless.ops.fused_triton`, imported only where Triton is
      installed and a CUDA platform binds ``forward_cuda``).
    * An op whose kernels are missing binds ``forward_native`` at construction, so the
      check is never repeated per call.
"""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType
from typing import Any, Callable

from forkless.ops.interface import CustomOp


@functools.cache
def cpu_kernels() -> ModuleType | None:
    """:mod:`forkless.ops.fused_cpu`, or None where the C kernels did not build (see the log)."""
    from forkless import cpu_kernels as lib

    if lib.load() is None:
        return None
    from forkless.ops import fused_cpu

    return fused_cpu


@functools.cache
def triton_kernels() -> ModuleType | None:
    """:mod:`forkless.ops.fused_triton`, or None where Triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        return None
    from forkless.ops import fused_triton

    return fused_triton


class FusedKernelOp(CustomOp):
    """A built-in op whose ``forward_cpu`` / ``forward_cuda`` run forkless's fused kernels.

    Where those kernels are missing, the op binds ``forward_native`` instead.
    """

    def dispatch_forward(self) -> Callable[..., Any]:
        method = super().dispatch_forward()
        name = method.__name__
        if name == "forward_cpu" and cpu_kernels() is None:
            return self.forward_native
        if name == "forward_cuda" and triton_kernels() is None:
            return self.forward_native
        return method
