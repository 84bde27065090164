"""Which of forkless's fused kernels this process can run, and the base of the ops that use them.

Invariants:
    * Each kernel module is looked for once per process: the C kernels
      (:mod:`forkless.ops.fused_cpu`, float32, built by :mod:`forkless.cpu_kernels`) and
      the Triton kernels (:mod:`forkless.ops.fused_triton`, imported only where Triton is
      installed and a CUDA platform binds ``forward_cuda``).
    * An op whose kernels are missing binds ``forward_native``, so the check is never
      repeated per call. Building an op never compiles the C kernels: the model runner
      loads them after the weights (a first start compiles them, a few seconds, which
      would otherwise count as loading the model). An op built before that binds a
      method that, on its first call, binds ``forward_cpu`` or, where the kernels did
      not build, ``forward_native``, and runs it.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Callable

from forkless.ops.interface import CustomOp
from forkless.triton_utils import triton_available


@functools.cache
def cpu_kernels() -> ModuleType | None:
    """:mod:`forkless.ops.fused_cpu`, or None where the C kernels did not build (see the log).

    The first call loads the kernels, compiling them on a first start.
    """
    from forkless import cpu_kernels as lib

    if lib.load() is None:
        return None
    from forkless.ops import fused_cpu

    return fused_cpu


def cpu_kernels_known() -> bool:
    """Whether :func:`cpu_kernels` has run in this process (so it costs nothing now)."""
    return cpu_kernels.cache_info().currsize > 0


@functools.cache
def triton_kernels() -> ModuleType | None:
    """:mod:`forkless.ops.fused_triton`, or None where Triton is not installed."""
    if not triton_available():
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
        if name == "forward_cpu":
            if not cpu_kernels_known():
                return self._load_cpu_kernels_then_bind
            if cpu_kernels() is None:
                return self.forward_native
        if name == "forward_cuda" and triton_kernels() is None:
            return self.forward_native
        return method

    def _load_cpu_kernels_then_bind(self, *args: Any, **kwargs: Any) -> Any:
        # The first call on the CPU platform, the C kernels not loaded when the op was built.
        self.bind_forward(self.forward_cpu if cpu_kernels() is not None else self.forward_native)
        return self._forward_method(*args, **kwargs)
