"""Linear layers on weights packed once at load, for the CPU.

* float32: :class:`PackedLinear`, forkless's own C kernel (:mod:`forkless.cpu_kernels`)
  over column panels; at 1-128 rows it is ahead of prepacked oneDNN float32 (18.6 vs 23.1
  ms a pass at one row, 62.4 vs 68.6 at 64; 2 threads, Xeon with AMX), from 512 rows
  within 5 % of it.
* bfloat16 on a CPU with AVX512-BF16 and no AMX: :class:`PackedLinearBF16`, forkless's C
  kernel on panels of bfloat16 pairs (``linear_bf16.c``: ahead of prepacked oneDNN at every
  row count measured, 2.0x at one row, 1.3x at 35, 1.07x at 2,048; 2-core Zen 4).
* bfloat16 otherwise (AMX, whose tiles oneDNN drives 3-12x faster than that kernel from 35
  rows up; benchmarks/README.md):
  :class:`OneDNNLinear`, oneDNN's matmul (through torch) on a weight reordered once into
  oneDNN's blocked layout. ``F.linear`` reorders the plain weight on every call: at decode
  sizes that is most of its time (one pass over SmolLM2-135M's layers and head, 2 threads,
  Xeon with AMX: 25.5 -> 15.2 ms at 32 rows, 19.5 -> 12.2 ms at one row).
  ``FORKLESS_CPU_BF16_LINEAR`` overrides the choice (:func:`bf16_linear_kind`).

Invariants: a packed layer holds its weight in its own layout and the ``nn.Linear`` it
replaces is dropped (a tied LM head is packed as a copy: the embedding keeps its rows; a
weight nothing else in the model shares is packed in its own memory by
:func:`pack_linear_layers`, not copied), outputs have the input's dtype and match
``nn.Linear`` up to the order of the sums, and which class a weight gets depends only on
its dtype, its shape and the CPU (:func:`cpu_linear_for`).
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any, ClassVar

import torch
from torch import nn

from forkless import cpu_kernels, envs

#: The batch size oneDNN's reorder is told to expect (a hint for its layout; any row count
#: runs on the result): decode steps, where the reorder matters most.
_ONEDNN_BATCH_HINT = 32


class CPULinear(nn.Module):
    """What the packed layers share: their shape, and the check and flattening of the input
    (``[..., in_features]`` of :attr:`dtype` on the CPU, as rows with unit column stride)."""

    #: The dtype of the weights and inputs the layer takes.
    dtype: ClassVar[torch.dtype]
    in_features: int
    out_features: int

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> CPULinear:
        """The packed equivalent of ``linear``."""
        return cls(linear.weight, linear.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as ``[rows, in_features]``, each row contiguous.

        Raises:
            ValueError: ``x`` is not of :attr:`dtype` on the CPU.
        """
        if x.dtype != self.dtype or x.device.type != "cpu":
            raise ValueError(f"{type(self).__name__} takes {str(self.dtype).removeprefix('torch.')} CPU input, "
                             f"got {x.dtype} on {x.device}")
        x2 = x.reshape(-1, self.in_features)
        return x2 if x2.stride(-1) == 1 and x2.stride(0) >= self.in_features else x2.contiguous()


class _PanelLinear(CPULinear):
    """What forkless's own packed layers share: the weight padded to whole panels of the
    library's width and packed once (:meth:`_pack`), a float32 bias padded alike, and the
    call of ``forkless_linear_{_suffix}``, whose output rows are whole panels wide.

    Args:
        weight: ``[out_features, in_features]`` of :attr:`dtype` on the CPU.
        bias: ``[out_features]`` or None (kept in float32).
        lib: The kernels to run on (:func:`forkless.cpu_kernels.load_isa`, to compare ISA
            levels); default: :func:`forkless.cpu_kernels.load`'s.
        consume: Pack ``weight`` in its own memory (its values are then the packed
            layout's: the caller must not use it again) where it is contiguous; when False,
            pack into a new tensor. At start-up this spares a second copy of the weights
            and its page faults. (A weight padded to whole panels is packed in the padded
            copy, which is the layer's own, either way.)

    Raises:
        RuntimeError: The CPU kernels are unavailable (check :func:`forkless.cpu_kernels.load`).
        ValueError: The weight is not of :attr:`dtype` on the CPU, or (a kernel taking K in
            pairs) its ``in_features`` is odd.
    """

    #: The kernel's symbol suffix and its panel width's symbol.
    _suffix: ClassVar[str]
    _width_symbol: ClassVar[str]
    #: Whether the kernel takes K in pairs (``in_features`` must be even).
    _k_pairs: ClassVar[bool] = False

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, lib: Any = None,
                 consume: bool = False) -> None:
        super().__init__()
        name = type(self).__name__
        lib = lib if lib is not None else cpu_kernels.load()
        if lib is None:
            raise RuntimeError(f"{name} needs the CPU kernels, which are unavailable (see the log)")
        if weight.dtype != self.dtype or weight.device.type != "cpu":
            raise ValueError(f"{name} takes a {str(self.dtype).removeprefix('torch.')} CPU weight, got "
                             f"{weight.dtype} on {weight.device}")
        self.out_features, self.in_features = weight.shape
        if self._k_pairs and self.in_features % 2:
            raise ValueError(f"{name} takes an even in_features (pairs of K), got {self.in_features}")
        self._kernel = getattr(lib, f"forkless_linear_{self._suffix}")
        width = getattr(lib, self._width_symbol)()
        padded = -(-self.out_features // width) * width
        w = weight.detach()
        if padded != self.out_features:  # zero columns, cut off the output again
            w = torch.cat([w, w.new_zeros(padded - self.out_features, self.in_features)])
            consume = True  # the padded copy is this layer's own
        packed = self._pack_in_place(w, width) if consume and w.is_contiguous() else self._pack(w, width)
        self.register_buffer("packed", packed, persistent=False)
        if bias is not None:
            b = torch.zeros(padded, dtype=torch.float32)
            b[: self.out_features] = bias.detach()
            bias = b
        self.register_buffer("bias", bias, persistent=False)

    @staticmethod
    def _pack(w: torch.Tensor, width: int) -> torch.Tensor:
        """``w`` (``[N, K]``, N whole panels) in the kernel's layout: ``[N / width, ...]``,
        whose dimension 2 is the panel width."""
        raise NotImplementedError

    @classmethod
    def _pack_in_place(cls, w: torch.Tensor, width: int, chunk_bytes: int = 4 << 20) -> torch.Tensor:
        """:meth:`_pack` of the contiguous ``w`` written over ``w`` itself: each panel's
        bytes are the same ones in either layout, so a few megabytes of panels at a time
        are packed into a small buffer and copied back."""
        n, k = w.shape
        panels = w.view(n // width, width * k)
        step = max(1, chunk_bytes // (width * k * w.element_size()))
        for first in range(0, panels.shape[0], step):
            part = cls._pack(w[first * width:(first + step) * width], width)
            panels[first:first + part.shape[0]].copy_(part.reshape(part.shape[0], -1))
        # One panel's packed shape, from a tensor without storage.
        layout = cls._pack(torch.empty(width, k, dtype=w.dtype, device="meta"), width).shape[1:]
        return panels.view(panels.shape[0], *layout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = self._rows(x)
        rows = x2.shape[0]
        panels, width = self.packed.shape[0], self.packed.shape[2]
        y = torch.empty(rows, panels * width, dtype=self.dtype)
        if rows:
            cpu_kernels.check(self._kernel(
                x2.data_ptr(), x2.stride(0), self.packed.data_ptr(),
                None if self.bias is None else self.bias.data_ptr(), y.data_ptr(), y.stride(0),
                rows, self.in_features, panels))
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        return y.reshape(*x.shape[:-1], self.out_features)


class PackedLinear(_PanelLinear):
    """``y = x w^T + b`` with ``w`` packed once into the kernel's column panels.

    The packed weight replaces the ``[out, in]`` one (same memory). Outputs match
    ``nn.Linear`` to float32 rounding (the sums run in another order). The panel width is
    the library's (24 columns with AVX2, 64 with AVX-512), so a layer is packed for the
    kernels it runs on. Arguments and errors: :class:`_PanelLinear`'s (a float32 weight).
    """

    dtype = torch.float32
    _suffix, _width_symbol = "f32", "forkless_linear_panel_width"

    @staticmethod
    def _pack(w: torch.Tensor, width: int) -> torch.Tensor:
        # [N, K] -> [N / width, K, width]: panel p is columns p*width.. of w^T, row by row.
        return w.view(w.shape[0] // width, width, w.shape[1]).transpose(1, 2).contiguous()

    @property
    def weight(self) -> torch.Tensor:
        """The ``[out_features, in_features]`` weight, unpacked (a copy, for inspection)."""
        panels, k, width = self.packed.shape
        return self.packed.transpose(1, 2).reshape(panels * width, k)[: self.out_features].contiguous()


class PackedLinearBF16(_PanelLinear):
    """``y = x w^T + b`` in bfloat16 with ``w`` packed once into the C kernel's panels of
    bfloat16 pairs (``forkless/cpu_kernels/csrc/linear_bf16.c``; AVX512-BF16 dot products).

    Sums are float32 and each output is rounded to bfloat16 once, after the bias: as
    ``F.linear`` in bfloat16, up to the order of the sums. ``in_features`` must be even
    (the kernel takes K in pairs). Arguments and errors: :class:`_PanelLinear`'s (a
    bfloat16 weight).
    """

    dtype = torch.bfloat16
    _suffix, _width_symbol, _k_pairs = "bf16", "forkless_linear_bf16_panel_width", True

    @staticmethod
    def _pack(w: torch.Tensor, width: int) -> torch.Tensor:
        # [N, K] -> [N / width, K / 2, width, 2]: panel p is columns p*width.. of w^T, two
        # rows of K at a time, each column's pair adjacent.
        return w.view(w.shape[0] // width, width, w.shape[1] // 2, 2).permute(0, 2, 1, 3).contiguous()

    @property
    def weight(self) -> torch.Tensor:
        """The ``[out_features, in_features]`` weight, unpacked (a copy, for inspection)."""
        panels, k2, width, _ = self.packed.shape
        return self.packed.permute(0, 2, 1, 3).reshape(panels * width, 2 * k2)[: self.out_features].contiguous()


@functools.lru_cache(maxsize=None)
def onednn_bf16_available() -> bool:
    """Whether torch's oneDNN runs bfloat16 matmuls on this CPU (AVX512-BF16 or AMX, or
    the AVX-512 it emulates them with), with the prepacked-weight ops
    :class:`OneDNNLinear` calls."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2, dtype=torch.bfloat16), 1)
        y = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2, dtype=torch.bfloat16), w, None, "none", [], "")
    except (AttributeError, RuntimeError):  # a torch without these ops, or oneDNN refusing
        return False
    return bool(torch.equal(y, torch.full((1, 2), 2.0, dtype=torch.bfloat16)))


class OneDNNLinear(CPULinear):
    """``y = x w^T + b`` in bfloat16 by oneDNN, on a weight reordered once into its layout.

    Args:
        weight: ``[out_features, in_features]`` bfloat16 on the CPU.
        bias: ``[out_features]`` or None.

    Raises:
        RuntimeError: oneDNN cannot run bfloat16 here (:func:`onednn_bf16_available`).
    """

    dtype = torch.bfloat16

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
            raise ValueError(f"OneDNNLinear takes a bfloat16 CPU weight, got {weight.dtype} on {weight.device}")
        if not onednn_bf16_available():
            raise RuntimeError("OneDNNLinear needs torch's oneDNN with bfloat16 support, which this CPU or "
                               "torch build lacks")
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _ONEDNN_BATCH_HINT),
                             persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16).contiguous(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = self._rows(x)
        if x2.shape[0] == 0:
            y = x2.new_empty(0, self.out_features)
        else:
            y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)


#: ``FORKLESS_CPU_BF16_LINEAR``'s values.
BF16_LINEAR_CHOICES = ("auto", "kernels", "onednn")


def bf16_linear_kind() -> str | None:
    """What runs bfloat16 linear layers on this CPU: ``"kernels"`` (:class:`PackedLinearBF16`),
    ``"onednn"`` (:class:`OneDNNLinear`) or None (neither: they stay ``nn.Linear``).

    ``FORKLESS_CPU_BF16_LINEAR=auto`` (the default) takes the C kernel where the CPU has
    AVX512-BF16 and no AMX, oneDNN elsewhere it runs; ``kernels`` or ``onednn`` asks for one
    (``kernels`` without AVX512-BF16 runs the kernel's plain loops: correct, slow).

    Raises:
        ValueError: The variable holds another value, or asks for what this CPU lacks.
    """
    want = envs.FORKLESS_CPU_BF16_LINEAR
    if want not in BF16_LINEAR_CHOICES:
        raise ValueError(f"FORKLESS_CPU_BF16_LINEAR={want!r}: expected one of {', '.join(BF16_LINEAR_CHOICES)}")
    lib = cpu_kernels.load()
    native = lib is not None and bool(lib.forkless_linear_bf16_native())
    if want == "kernels" and lib is None:
        raise ValueError("FORKLESS_CPU_BF16_LINEAR=kernels: forkless's CPU kernels are unavailable (see the log)")
    if want == "onednn" and not onednn_bf16_available():
        raise ValueError("FORKLESS_CPU_BF16_LINEAR=onednn: torch's oneDNN has no bfloat16 matmul on this CPU "
                         "or torch build")
    if want == "kernels" or (want == "auto" and native and "amx_bf16" not in cpu_kernels.cpu_flags()):
        return "kernels"
    return "onednn" if onednn_bf16_available() else None


def cpu_linear_dtype_supported(dtype: torch.dtype) -> bool:
    """Whether this CPU has a packed linear layer for weights of ``dtype``: float32 with
    forkless's C kernels built, bfloat16 with either of :func:`bf16_linear_kind`'s."""
    if dtype == torch.float32:
        return cpu_kernels.load() is not None
    if dtype == torch.bfloat16:
        return bf16_linear_kind() is not None
    return False


def cpu_linear_for(weight: torch.Tensor, bias: torch.Tensor | None = None, consume: bool = False) -> CPULinear:
    """The packed layer for ``weight``: :class:`PackedLinear` for float32; for bfloat16
    :class:`PackedLinearBF16` or :class:`OneDNNLinear` as :func:`bf16_linear_kind` says
    (oneDNN for an odd ``in_features``, which the C kernel does not take). ``consume``:
    forkless's own layers may pack ``weight`` in its own memory (see :class:`_PanelLinear`).

    Raises:
        ValueError: No packed layer takes that dtype.
    """
    if weight.dtype == torch.float32:
        return PackedLinear(weight, bias, consume=consume)
    if weight.dtype == torch.bfloat16:
        if bf16_linear_kind() == "kernels" and weight.shape[1] % 2 == 0:
            return PackedLinearBF16(weight, bias, consume=consume)
        return OneDNNLinear(weight, bias)
    raise ValueError(f"no packed CPU linear layer for {weight.dtype} weights: expected float32 or bfloat16")


def pack_linear_layers(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` in ``model`` by its packed layer (:func:`cpu_linear_for`),
    packing in the weight's own memory where no other tensor of the model shares it.

    Returns:
        How many layers were replaced.
    """
    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    owners = Counter(tensor.untyped_storage().data_ptr() for _, tensor in tensors)  # storage -> its tensors
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                alone = owners[child.weight.untyped_storage().data_ptr()] == 1
                setattr(module, name, cpu_linear_for(child.weight, child.bias, consume=alone))
                count += 1
    return count


def cpu_linear_name(dtype: torch.dtype) -> str:
    """What runs the packed layers of ``dtype``, for the log."""
    if dtype == torch.float32 or bf16_linear_kind() == "kernels":
        return "forkless's C kernels"
    return "oneDNN, prepacked"


def use_cpu_linear(model: nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    """Move a model (``CausalLMBase`` or ``SupportsPooling``) that declares
    ``supports_cpu_kernels`` onto the packed linear layers where this device and dtype have
    them (float32: the C kernels; bfloat16: the C kernels or oneDNN, prepacked, as
    :func:`bf16_linear_kind` says); the model runners call it once, after loading weights.

    Returns:
        Whether the model's ``use_cpu_kernels`` ran.
    """
    from forkless.models.interface import CausalLMBase
    from forkless.pooling.interface import SupportsPooling

    if device.type != "cpu" or not isinstance(model, (CausalLMBase, SupportsPooling)):
        return False
    if not model.supports_cpu_kernels or not cpu_linear_dtype_supported(dtype):
        return False
    model.use_cpu_kernels()
    return True
