"""Rotary position embedding (custom op ``rotary_embedding``; GPT-NeoX "rotate half" layout).

cos/sin are computed from the positions on every call rather than looked up in a table:
it is a single small outer product, it has no maximum length, and it reproduces the
Hugging Face float32 computation exactly.

Invariants: ``forward_cpu`` (C kernel, float32 or bfloat16) and ``forward_cuda`` (Triton, CUDA
tensors only) rotate ``q`` and ``k`` in place; ``forward_native`` returns new tensors.
Every implementation returns the rotated pair, equal to float32 rounding.
:meth:`RotaryEmbedding.rotate_normed` (models with per-head query/key norms) runs the two
norms and the rotation as one Triton kernel only where all three ops are forkless's own
and bound to ``forward_cuda``: an op replaced by a plugin, or turned off by
``FORKLESS_CUSTOM_OPS``, is always called as itself. :meth:`RotaryEmbedding.rotate_and_store`
adds the attention backend's KV store to that one launch (or to the plain rotation's), on the
same conditions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import torch
from forkless.ops.interface import CustomOp
from forkless.ops import fused_cpu
from forkless.ops.kernels import FusedKernelOp, triton_kernels
from forkless.ops.layernorm import RMSNorm

if TYPE_CHECKING:
    from forkless.attention.interface import KVStoreTarget


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _linear_inv_freq(params: dict[str, Any], dim: int) -> torch.Tensor:
    # Linear position interpolation: position p behaves like p / factor.
    return _default_inv_freq(params["rope_theta"], dim) / float(params["factor"])


def _llama3_inv_freq(params: dict[str, Any], dim: int) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths are interpolated, short ones kept, smooth between."""
    inv_freq = _default_inv_freq(params["rope_theta"], dim)
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context_len = float(params["original_max_position_embeddings"])

    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


_INV_FREQ: dict[str, Callable[[dict[str, Any], int], torch.Tensor]] = {
    "default": lambda params, dim: _default_inv_freq(params["rope_theta"], dim),
    "linear": _linear_inv_freq,
    "llama3": _llama3_inv_freq,
}


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@CustomOp.register("rotary_embedding")
class RotaryEmbedding(FusedKernelOp):
    """Applies rotary embeddings to flattened-batch queries and keys.

    Args:
        head_dim: Size of one attention head.
        rope_parameters: Output of
            :func:`forkless.models.hf_config.get_rope_parameters` (``rope_type``,
            ``rope_theta``, type-specific fields, optional ``partial_rotary_factor``).

    Raises:
        ValueError: The ``rope_type`` is not supported; the message lists those that are.
    """

    def __init__(self, head_dim: int, rope_parameters: dict[str, Any]) -> None:
        super().__init__()
        rope_type = rope_parameters.get("rope_type", "default")
        if rope_type not in _INV_FREQ:
            raise ValueError(
                f"unsupported rope_type {rope_type!r}; supported: {', '.join(sorted(_INV_FREQ))}"
            )
        self.head_dim = head_dim
        self.rotary_dim = int(head_dim * float(rope_parameters.get("partial_rotary_factor", 1.0)))
        inv_freq = _INV_FREQ[rope_type](rope_parameters, self.rotary_dim)
        # Not persistent: checkpoints' own inv_freq buffers are ignored, ours is derived.
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self._memo: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``[T, 1, rotary_dim]`` cos and sin tables of ``positions``, in ``dtype``."""
        # Every layer of a step gets the same positions tensor: compute once per step, not
        # once per layer. The memo holds the tensor itself, so its identity is not reused.
        memo = self._memo
        if memo is not None and memo[0] is positions and memo[1] == dtype:
            return memo[2], memo[3]
        inv_freq = self.inv_freq.to(device=positions.device, dtype=torch.float32)
        freqs = positions.float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, rotary_dim]
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        self._memo = (positions, dtype, cos, sin)
        return cos, sin

    def forward_native(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k`` by their tokens' positions.

        Args:
            positions: ``[T]`` int64 absolute position of each token in its sequence.
            q: ``[T, Hq, head_dim]``.
            k: ``[T, Hkv, head_dim]``.

        Returns:
            The rotated ``(q, k)``, same shapes and dtypes. The fused kernels rotate in
            place: pass tensors nothing else reads afterwards.
        """
        cos, sin = self.cos_sin(positions, q.dtype)
        if self.rotary_dim == self.head_dim:
            return _rotate(q, cos, sin), _rotate(k, cos, sin)
        r = self.rotary_dim
        q = torch.cat((_rotate(q[..., :r], cos, sin), q[..., r:]), dim=-1)
        k = torch.cat((_rotate(k[..., :r], cos, sin), k[..., r:]), dim=-1)
        return q, k

    def forward_cpu(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if q.dtype not in fused_cpu.DTYPES or k.dtype != q.dtype:
            return self.forward_native(positions, q, k)
        cos, sin = self.cos_sin(positions, q.dtype)
        fused_cpu.rotary_(q, k, cos, sin, self.rotary_dim)
        return q, k

    def forward_cuda(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not q.is_cuda:
            return self.forward_native(positions, q, k)
        cos, sin = self.cos_sin(positions, q.dtype)
        triton_kernels().rotary_(q, k, cos, sin, self.rotary_dim)
        return q, k

    def _fusable(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether this is the built-in rotation running its Triton kernel over whole heads of
        CUDA tensors whose head dimension is contiguous (what the fused kernels take)."""
        return (q.is_cuda and type(self) is RotaryEmbedding and self.implementation == "forward_cuda"
                and self.rotary_dim == self.head_dim and q.stride(-1) == 1 and k.stride(-1) == 1)

    def rotate_and_store(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, store: KVStoreTarget,
        q_norm: CustomOp | None = None, k_norm: CustomOp | None = None,
    ) -> bool:
        """Rotate ``q`` and ``k`` in place (after the per-head norms, if given) and store the
        rotated keys and ``v`` into ``store``'s cache, in one launch -- where the ops are the
        built-in ones running their Triton kernels over whole heads.

        Returns:
            Whether it did; ``False``: nothing was touched, call the ops and let the
            attention backend store the keys and values itself.
        """
        if not (self._fusable(q, k) and v.stride(-1) == 1 and (q_norm is None) == (k_norm is None)):
            return False
        if q_norm is not None and not (_cuda_rms_norm(q_norm) and _cuda_rms_norm(k_norm)):
            return False
        cos, sin = self.cos_sin(positions, q.dtype)
        kernels = triton_kernels()
        if q_norm is None:
            kernels.rotary_(q, k, cos, sin, self.rotary_dim, v, store)
        else:
            kernels.qk_norm_rotary_(q, k, q_norm.weight, k_norm.weight, q_norm.eps, k_norm.eps, cos, sin, v, store)
        return True

    def rotate_normed(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_norm: CustomOp, k_norm: CustomOp
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``self(positions, q_norm(q), k_norm(k))``: per-head norms, then the rotation.

        One launch on CUDA where the three ops are the built-in ones running their Triton
        kernels and the rotation covers whole heads (``q`` and ``k`` are then overwritten:
        pass views nothing else reads, as the QKV projection's split is); otherwise the
        three ops are called one after the other.
        """
        if self._fusable(q, k) and _cuda_rms_norm(q_norm) and _cuda_rms_norm(k_norm):
            cos, sin = self.cos_sin(positions, q.dtype)
            triton_kernels().qk_norm_rotary_(q, k, q_norm.weight, k_norm.weight, q_norm.eps, k_norm.eps, cos, sin)
            return q, k
        return self(positions, q_norm(q), k_norm(k))


def _cuda_rms_norm(op: CustomOp | None) -> bool:
    """Whether ``op`` is the built-in RMSNorm bound to its Triton kernel (which the fused
    norm-and-rotate kernel computes exactly)."""
    return type(op) is RMSNorm and op.implementation == "forward_cuda"
