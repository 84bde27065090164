"""The fused layer ops of :mod:`~forkless.ops.fused_triton`, on the CPU kernels.

Same functions, same signatures and arguments (documented there), for float32 and bfloat16
tensors (:data:`DTYPES`; see ``forkless/cpu_kernels/csrc/layers.c``): every tensor of a
call in the same one.
The built-in custom ops call them from ``forward_cpu`` (:mod:`forkless.ops.kernels` binds
that only where the kernels loaded).
"""

from __future__ import annotations

import torch

from forkless import cpu_kernels
from forkless.ops.fused_buffers import rms_norm_buffers


#: The dtypes the kernels take, and their symbols' suffix.
DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _kernel(name: str, dtype: torch.dtype):
    """The C function ``forkless_{name}_{suffix}`` for tensors of ``dtype``."""
    lib = cpu_kernels.load()
    assert lib is not None, "fused_cpu is used only where the CPU kernels loaded"
    return getattr(lib, f"forkless_{name}_{DTYPES[dtype]}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`forkless.ops.fused_triton.rms_norm` on the C kernel."""
    x3, residual, out, res_out = rms_norm_buffers(x, residual)
    t, h, n = x3.shape
    weight = weight.contiguous()
    _kernel("rms_norm", x.dtype)(
        x3.data_ptr(), x3.stride(0), x3.stride(1),
        residual.data_ptr() if residual is not None else None,
        residual.stride(0) if residual is not None else 0,
        weight.data_ptr(), out.data_ptr(), res_out.data_ptr() if res_out is not None else None,
        t, h, n, eps)
    return (out if x.dim() == 3 else out.squeeze(1)), res_out


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            rotary_dim: int) -> None:
    """:func:`forkless.ops.fused_triton.rotary_` on the C kernel (in place)."""
    if cos.stride(-1) != 1 or sin.stride(-1) != 1 or sin.stride(0) != cos.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    _kernel("rotary", q.dtype)(
        q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
        cos.data_ptr(), sin.data_ptr(), cos.stride(0), q.shape[0], q.shape[1], k.shape[1], rotary_dim)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """:func:`forkless.ops.fused_triton.silu_and_mul` on the C kernel."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    t, d = x.shape[0], x.shape[1] // 2
    out = torch.empty((t, d), dtype=x.dtype)
    _kernel("silu_and_mul", x.dtype)(x.data_ptr(), x.stride(0), out.data_ptr(), t, d)
    return out
