"""Linear layers on the CPU kernels' packed weights (float32, see :mod:`forkless.cpu_kernels`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from forkless import cpu_kernels


class PackedLinear(nn.Module):
    """``y = x w^T + b`` with ``w`` packed once into the kernel's column panels.

    The packed weight replaces the ``[out, in]`` one (same memory). Outputs match
    ``nn.Linear`` to float32 rounding (the sums run in another order). The panel width is
    the library's (24 columns with AVX2, 48 with AVX-512), so a layer is packed for the
    kernels it runs on.

    Args:
        weight: ``[out_features, in_features]`` float32 on the CPU.
        bias: ``[out_features]`` or None.
        lib: The kernels to run on (:func:`forkless.cpu_kernels.load_isa`, to compare ISA
            levels); default: :func:`forkless.cpu_kernels.load`'s.

    Raises:
        RuntimeError: The CPU kernels are unavailable (check :func:`forkless.cpu_kernels.load`).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, lib: Any = None) -> None:
        super().__init__()
        lib = lib if lib is not None else cpu_kernels.load()
        if lib is None:
            raise RuntimeError("PackedLinear needs the CPU kernels, which are unavailable (see the log)")
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(f"PackedLinear takes a float32 CPU weight, got {weight.dtype} on {weight.device}")
        self._kernel = lib.forkless_linear_f32
        width = lib.forkless_linear_panel_width()
        self.out_features, self.in_features = weight.shape
        padded = -(-self.out_features // width) * width
        w = weight.detach()
        if padded != self.out_features:  # zero columns, cut off the output again
            w = torch.cat([w, w.new_zeros(padded - self.out_features, self.in_features)])
        # [N, K] -> [N / width, K, width]: panel p is columns p*width.. of w^T, row by row.
        self.register_buffer("packed", w.view(padded // width, width, self.in_features).transpose(1, 2).contiguous(),
                             persistent=False)
        if bias is not None:
            b = torch.zeros(padded, dtype=torch.float32)
            b[: self.out_features] = bias.detach()
            bias = b
        self.register_buffer("bias", bias, persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedLinear:
        """The packed equivalent of ``linear``."""
        return cls(linear.weight, linear.bias)

    @property
    def weight(self) -> torch.Tensor:
        """The ``[out_features, in_features]`` weight, unpacked (a copy, for inspection)."""
        panels, k, width = self.packed.shape
        return self.packed.transpose(1, 2).reshape(panels * width, k)[: self.out_features].contiguous()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"PackedLinear takes float32 CPU input, got {x.dtype} on {x.device}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.stride(-1) != 1 or x2.stride(0) < self.in_features:
            x2 = x2.contiguous()
        rows = x2.shape[0]
        panels, _, width = self.packed.shape
        y = torch.empty(rows, panels * width, dtype=torch.float32)
        if rows:
            cpu_kernels.check(self._kernel(
                x2.data_ptr(), x2.stride(0), self.packed.data_ptr(),
                None if self.bias is None else self.bias.data_ptr(), y.data_ptr(), y.stride(0),
                rows, self.in_features, panels))
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        return y.reshape(*lead, self.out_features)


def pack_linear_layers(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` in ``model`` by its :class:`PackedLinear`.

    Returns:
        How many layers were replaced.
    """
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear.from_linear(child))
                count += 1
    return count
