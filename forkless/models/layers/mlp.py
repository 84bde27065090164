"""The SwiGLU feed-forward block of Llama-family models."""

from __future__ import annotations

import torch
from torch import nn

from forkless.models.layers.activation import SiluAndMul


class SwiGLUMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused into one matmul.

    Parameter ``gate_up_proj.weight`` is ``[2 * intermediate, hidden]``: the Hugging Face
    ``gate_proj`` rows first, then ``up_proj``.

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))
