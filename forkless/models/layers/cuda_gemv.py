"""One-row linear layers on CUDA through a Triton GEMV (:mod:`forkless.ops.gemv_triton`).

Batch-1 decode is a chain of one-row products, each reading a whole weight matrix; cuBLAS
runs them at ~3.0-4.1 TB/s on an H200 and launches each only once the one before has
ended. :class:`GemvLinear` is an ``nn.Linear`` whose one-row calls run the Triton GEMV
instead (launched with programmatic dependent launch on Hopper, so that a projection's
weight reads start while the kernel before it finishes), and whose other calls stay
``F.linear``. With it, a SwiGLU block whose down projection is one feeds the gate/up
output straight into that GEMV, which applies SiLU-and-mul as it reads its input (one
launch less per layer).

Invariants:
    * Only the class of in-tree ``nn.Linear`` layers changes (parameters, names and
      loading untouched), and only for a half-precision model on CUDA with
      ``FORKLESS_CUDA_GEMV`` on and without LoRA adapters: a layer a plugin or LoRA
      replaced keeps its own forward.
    * SiLU-and-mul is folded into the down projection only where the block's activation
      is the in-tree op running its own CUDA kernel: an op a plugin replaced, or one
      turned off, is always called.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from forkless import envs
from forkless.triton_utils import triton_available

#: Dtypes the GEMV serves (float32 keeps cuBLAS: its outputs are compared bit for bit).
GEMV_DTYPES = (torch.bfloat16, torch.float16)


class GemvLinear(nn.Linear):
    """``nn.Linear`` whose one-row products on CUDA run the Triton GEMV."""

    def _one_row(self, x: torch.Tensor, width: int) -> bool:
        return x.numel() == width and x.is_cuda and x.is_contiguous() and x.dtype == self.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._one_row(x, self.in_features):
            from forkless.ops.gemv_triton import gemv

            return gemv(x, self.weight, self.bias).view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)

    def forward_silu_and_mul(self, gate_up: torch.Tensor, act_fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``self(act_fn(gate_up))`` where ``act_fn`` is SiLU-and-mul; one launch for one row."""
        if self._one_row(gate_up, 2 * self.in_features):
            from forkless.ops.gemv_triton import gemv

            return gemv(gate_up, self.weight, self.bias, act=True).view(*gate_up.shape[:-1], self.out_features)
        return self.forward(act_fn(gate_up))


def use_cuda_gemv(model: nn.Module, device: torch.device, dtype: torch.dtype, lora: bool) -> int:
    """Give a model's projections (``lora_modules()``) and untied LM head the GEMV where it
    applies (see the module's invariants); the model runner calls it once after loading.

    Returns:
        How many layers now run it (0 where it does not apply).
    """
    from forkless.models.interface import CausalLMBase
    from forkless.models.layers.activation import SiluAndMul
    from forkless.models.layers.mlp import SwiGLUMLP

    if (device.type != "cuda" or dtype not in GEMV_DTYPES or lora or not envs.FORKLESS_CUDA_GEMV
            or not isinstance(model, CausalLMBase) or not model.supports_lora
            or not triton_available()):
        return 0
    names = list(model.lora_modules())
    count = 0
    for name in names + ["lm_head"]:
        try:
            layer = model.get_submodule(name)
        except AttributeError:
            continue
        if type(layer) is nn.Linear:
            layer.__class__ = GemvLinear
            count += 1
    for module in model.modules():
        if (isinstance(module, SwiGLUMLP) and type(module.down_proj) is GemvLinear
                and type(module.act_fn) is SiluAndMul and module.act_fn.implementation == "forward_cuda"):
            module.down_fuses_act = True
    return count
