"""Gated activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from forkless.models.layers.fused import fused_ops


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` for a fused ``[..., 2 * d]`` gate/up projection (gate first)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = fused_ops(x)
        if fused is not None:
            return fused.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        # In place on silu's fresh output: one [tokens, d] temporary less per layer.
        return F.silu(gate).mul_(up)
