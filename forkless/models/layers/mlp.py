"""The SwiGLU feed-forward block of Llama-family models."""

from __future__ import annotations

import torch
from torch import nn

from forkless.models.layers.activation import SiluAndMul


class SwiGLUMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused into one matmul.

    Parameter ``gate_up_proj.weight`` is ``[2 * intermediate, hidden]``: the Hugging Face
    ``gate_proj`` rows first, then ``up_proj``.

    Attributes:
        down_fuses_act: The down projection applies SiLU-and-mul as it reads the gate/up
            output (:class:`~forkless.models.layers.cuda_gemv.GemvLinear`, set by
            ``use_cuda_gemv``): one launch less for one-row products.

    Args:
        hidden_size: Model width.
        intermediate_size: Width of the gated hidden layer.
        bias: Whether the projections have biases (``mlp_bias`` in Llama configs).
        dtype: Parameter dtype.
    """

    def __init__(
        self, hidden_size: int, intermediate_size: int, bias: bool = False, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias, dtype=dtype)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, dtype=dtype)
        self.act_fn = SiluAndMul()

    down_fuses_act = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.down_fuses_act:
            return self.down_proj.forward_silu_and_mul(self.gate_up_proj(x), self.act_fn)
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))
