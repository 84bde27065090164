"""Linear layers on GGUF Q8_0 / Q4_1 weights kept quantized, for the CPU
(``--quantization gguf``).

Invariants: the layer holds exactly the file's bytes (its blocks split into quants and
float16 scales, as ``quant_linear.c`` reads them). Up to :data:`KERNEL_MAX_ROWS` rows
(decode steps, short prefills) a C kernel reads the quants; more rows (long prefill chunks)
dequantize the weight for the call and run ``F.linear``, where the arithmetic, not the
bytes, is the cost. The kernel takes the activations (``activations``,
``FORKLESS_GGUF_ACTIVATIONS``) either as float32, and its output is then ``F.linear`` over
the dequantized weight (GGUF's own definition: Q8_0 ``d * q``, Q4_1 ``d * q + m``) up to the
order of the sums; or rounded to int8 per block of 32 with one scale each (as llama.cpp
does), its output then that of the rounded activations (within ~1 % of the float32 route's,
relative L2, for unit-variance inputs: the quality tests hold the model's logits to it),
for integer block products. ``auto`` (the default) takes the route found faster for the
kernels' ISA level and the CPU's cores (:func:`auto_activations`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from forkless import cpu_kernels, envs
from forkless.models.layers.cpu_linear import CPULinear

if TYPE_CHECKING:
    import numpy as np

#: Rows at or below which the C kernel runs. It widens each block once per 4 rows, so its
#: time grows with the rows; dequantizing the layer for the call costs a fixed ~1.5 ms a
#: layer and then F.linear runs at the float32 GEMM's rate. Crossing over near 300 rows
#: (six Q4_1 layers of the default model, 2 threads, Xeon with AMX: 4.0 ms at 16 rows, 15.5
#: at 64, 34.1 at 128 against 55-73 ms dequantized).
KERNEL_MAX_ROWS = 256
#: How the kernel can take the activations (``FORKLESS_GGUF_ACTIVATIONS``).
ACTIVATIONS = ("auto", "int8", "float32")
#: GGUF formats this layer takes, with the bytes of one block of 32 weights.
FORMATS = {"Q8_0": 34, "Q4_1": 20}
_QK = 32


def auto_activations(isa: str, vendor: str | None = None) -> str:
    """The route ``auto`` takes with kernels built for ``isa`` (``cpu_kernels.ISA_LEVELS``).

    Args:
        isa: The kernels' level.
        vendor: The CPU's vendor (``cpu_kernels.cpu_vendor()`` when None).

    ``int8`` for ``avx2``: the layers of the default model on two threads
    (``benchmarks/cpu_linear_isa.py --gguf``) ran 1.46x as fast at one row and 1.18-1.25x at
    4-16 on an AVX2-only EPYC, 1.27-1.33x on an AVX-512 Xeon held to AVX2. For ``avx512``
    it depends on the cores: on an Intel Xeon (AVX512-VNNI), whose float32 route widens a
    Q4_1 block with one 16-lane permute, the int8 route (two blocks a VPDPBUSD) ran as fast
    (0.93-0.99x at 1-16 rows on two threads, 1.01-1.05x on eight), so ``float32``, whose
    outputs are the dequantized model's; AMD's Zen 4 runs those 512-bit operations as two
    halves, and a standalone prototype of the int8 route (VPDPBUSD per block) took a Q4_1
    layer at one row in 2.4x less time than the float32 kernel there, so ``int8`` (not yet
    measured with this kernel). ``float32`` for ``portable`` (plain loops, not measured).
    """
    if isa == "avx2":
        return "int8"
    if isa == "avx512":
        return "int8" if (cpu_kernels.cpu_vendor() if vendor is None else vendor) == "AuthenticAMD" else "float32"
    return "float32"


class GGUFLinear(CPULinear):
    """``y = x w^T + b`` with ``w`` in GGUF Q8_0 or Q4_1 blocks (float32 input and output).

    Args:
        format: ``"Q8_0"`` or ``"Q4_1"``.
        rows: ``[out_features, in_features / 32 * FORMATS[format]]`` uint8, the file's blocks
            row by row.
        in_features: Weights per row (a multiple of 32).
        bias: ``[out_features]`` float32 or None.
        activations: One of :data:`ACTIVATIONS`; None: ``FORKLESS_GGUF_ACTIVATIONS``. The
            route taken (``auto`` resolved) is the layer's ``activations``.
        lib: The CPU kernels to run on (``cpu_kernels.load_isa``, to compare levels);
            None: those :func:`forkless.cpu_kernels.load` chose.

    Raises:
        ValueError: Another format, a row size that does not match, ``in_features`` not
            a multiple of 32, or another ``activations``.
        RuntimeError: The CPU kernels are unavailable.
    """

    dtype = torch.float32

    def __init__(self, format: str, rows: "np.ndarray", in_features: int, bias: torch.Tensor | None = None,
                 activations: str | None = None, lib: Any = None) -> None:
        super().__init__()
        import numpy as np

        activations = envs.FORKLESS_GGUF_ACTIVATIONS if activations is None else activations
        if activations not in ACTIVATIONS:
            raise ValueError(f"GGUF activations {activations!r} (FORKLESS_GGUF_ACTIVATIONS): expected one of "
                             f"{', '.join(ACTIVATIONS)}")
        if format not in FORMATS:
            raise ValueError(f"GGUFLinear takes {' or '.join(FORMATS)} weights, got {format}")
        if in_features % _QK or rows.ndim != 2 or rows.shape[1] != in_features // _QK * FORMATS[format]:
            raise ValueError(f"{format} rows of shape {tuple(rows.shape)} do not hold {in_features} weights each in "
                             f"blocks of {_QK}")
        lib = cpu_kernels.load() if lib is None else lib
        if lib is None:
            raise RuntimeError("GGUFLinear needs the CPU kernels, which are unavailable (see the log)")
        self.format, self.in_features, self.out_features = format, in_features, int(rows.shape[0])
        self.activations = auto_activations(lib.isa) if activations == "auto" else activations
        self._kernel = getattr(lib, f"forkless_linear_{format.lower()}{'_i8' if self.activations == 'int8' else ''}")
        n, nb = self.out_features, in_features // _QK
        blocks = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.uint8)).view(n, nb, FORMATS[format])

        def f16(start: int) -> torch.Tensor:  # bytes start:start + 2 of each block: [n, nb] float16
            return blocks[..., start:start + 2].contiguous().view(torch.float16).view(n, nb)

        self.register_buffer("scales", f16(0), persistent=False)
        self.register_buffer("mins", f16(2) if format == "Q4_1" else None, persistent=False)
        quants = blocks[..., 2:].contiguous().view(torch.int8) if format == "Q8_0" else blocks[..., 4:].contiguous()
        self.register_buffer("qs", quants.view(n, -1), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous(), persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized ``[out_features, in_features]`` float32 weight (a new tensor)."""
        n, nb = self.out_features, self.in_features // _QK
        if self.format == "Q8_0":
            q = self.qs.view(n, nb, _QK).float()
        else:  # byte j of a block: element j in its low nibble, element j + 16 in its high one
            nibbles = self.qs.view(n, nb, _QK // 2)
            q = torch.cat([nibbles & 15, nibbles >> 4], dim=-1).float()
        w = q * self.scales.float()[..., None]
        if self.mins is not None:
            w = w + self.mins.float()[..., None]
        return w.view(n, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = self._rows(x)
        rows = x2.shape[0]
        if rows > KERNEL_MAX_ROWS:
            y = F.linear(x2, self.weight, self.bias)
        else:
            y = torch.empty(rows, self.out_features, dtype=torch.float32)
            if rows:
                weights = (self.qs.data_ptr(), self.scales.data_ptr())
                if self.mins is not None:
                    weights += (self.mins.data_ptr(),)
                cpu_kernels.check(self._kernel(
                    x2.data_ptr(), x2.stride(0), *weights, None if self.bias is None else self.bias.data_ptr(),
                    y.data_ptr(), y.stride(0), rows, self.in_features, self.out_features))
        return y.reshape(*x.shape[:-1], self.out_features)
