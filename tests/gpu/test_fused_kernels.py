"""The fused Triton layer kernels against the PyTorch ops they replace (run on the CPU)."""

from __future__ import annotations

import pytest
import torch

from forkless.models.layers.activation import SiluAndMul
from forkless.models.layers.norm import RMSNorm
from forkless.models.layers.rotary import RotaryEmbedding

# Imports Triton: the GPU conftest skips these tests where it is missing.
fused_triton = pytest.importorskip("forkless.ops.fused_triton",
                                   reason="needs Triton; not installed")

DTYPES = [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)]


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    # bfloat16: products and sums round like PyTorch's, but mean-square reductions
    # accumulate in another order, so a value may land one rounding step away.
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, tol, with_residual):
    torch.manual_seed(0)
    norm = RMSNorm(4096, 1e-5, dtype=dtype)
    norm.weight.data.normal_(1.0, 0.1)
    x = torch.randn(7, 4096, dtype=dtype)
    res = torch.randn(7, 4096, dtype=dtype) if with_residual else None
    out, summed = fused_triton.rms_norm(x.cuda(), norm.weight.cuda(), norm.eps,
                                        res.cuda() if with_residual else None)
    if with_residual:
        want, want_sum = norm(x, res)
        _close(summed, want_sum, 0.0)
    else:
        want = norm(x)
        assert summed is None
    _close(out, want, tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_per_head_rms_norm_on_strided_view(dtype, tol):
    # Qwen3's q/k norm: [T, H, D] views into the fused qkv projection's output.
    torch.manual_seed(1)
    qkv = torch.randn(5, (16 + 2 * 8) * 128, dtype=dtype)
    q = qkv[:, : 16 * 128].view(5, 16, 128)
    norm = RMSNorm(128, 1e-6, dtype=dtype)
    norm.weight.data.normal_(1.0, 0.1)
    out, _ = fused_triton.rms_norm(q.cuda(), norm.weight.cuda(), norm.eps)
    _close(out, norm(q), tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
], ids=["default", "llama3", "partial"])
def test_rotary_in_place(dtype, tol, rope):
    torch.manual_seed(2)
    hq, hkv, d = 8, 2, 128
    rotary = RotaryEmbedding(d, rope)
    qkv = torch.randn(9, (hq + 2 * hkv) * d, dtype=dtype)
    positions = torch.randint(0, 20000, (9,))
    q = qkv[:, : hq * d].view(9, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(9, hkv, d)
    want_q, want_k = rotary(positions, q.clone(), k.clone())
    qkv_gpu = qkv.cuda()
    q_gpu = qkv_gpu[:, : hq * d].view(9, hq, d)
    k_gpu = qkv_gpu[:, hq * d : (hq + hkv) * d].view(9, hkv, d)
    cos, sin = rotary.cuda().cos_sin(positions.cuda(), dtype)
    fused_triton.rotary_(q_gpu, k_gpu, cos, sin, rotary.rotary_dim)
    # cos/sin themselves come from the GPU's sin/cos: allow their last-bit differences.
    _close(q_gpu, want_q, max(tol, 1e-4))
    _close(k_gpu, want_k, max(tol, 1e-4))
    _close(qkv_gpu[:, (hq + hkv) * d :], qkv[:, (hq + hkv) * d :], 0.0)  # v untouched


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_silu_and_mul(dtype, tol):
    torch.manual_seed(3)
    x = torch.randn(6, 2 * 14336, dtype=dtype)
    _close(fused_triton.silu_and_mul(x.cuda()), SiluAndMul()(x), tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("num_tokens", [3, 300])
def test_qk_norm_rotary_in_place(dtype, tol, num_tokens):
    # Qwen3: per-head norms of q and k, then the rotation, as one kernel over the views
    # into the qkv projection's output; equal to the three ops one after the other.
    torch.manual_seed(4)
    hq, hkv, d = 16, 8, 128
    rotary = RotaryEmbedding(d, {"rope_type": "default", "rope_theta": 1000000.0})
    q_norm, k_norm = RMSNorm(d, 1e-6, dtype=dtype), RMSNorm(d, 1e-5, dtype=dtype)
    q_norm.weight.data.normal_(1.0, 0.1)
    k_norm.weight.data.normal_(1.0, 0.1)
    qkv = torch.randn(num_tokens, (hq + 2 * hkv) * d, dtype=dtype)
    positions = torch.randint(0, 20000, (num_tokens,))
    q = qkv[:, : hq * d].view(num_tokens, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(num_tokens, hkv, d)
    want_q, want_k = rotary(positions, q_norm(q), k_norm(k))
    qkv_gpu = qkv.cuda()
    q_gpu = qkv_gpu[:, : hq * d].view(num_tokens, hq, d)
    k_gpu = qkv_gpu[:, hq * d : (hq + hkv) * d].view(num_tokens, hkv, d)
    got_q, got_k = rotary.cuda().rotate_normed(positions.cuda(), q_gpu, k_gpu, q_norm.cuda(), k_norm.cuda())
    assert got_q.data_ptr() == q_gpu.data_ptr()  # the one-kernel path ran (in place)
    _close(got_q, want_q, max(tol, 1e-4))
    _close(got_k, want_k, max(tol, 1e-4))
    _close(qkv_gpu[:, (hq + hkv) * d :], qkv[:, (hq + hkv) * d :], 0.0)  # v untouched


def test_qk_norm_rotary_stands_aside_for_a_replaced_norm():
    # A plugin's replacement of rms_norm subclasses RMSNorm: the one-kernel path must not
    # bypass it, so the three ops run one after the other (and the replacement is called).
    calls = []

    class CountingNorm(RMSNorm):
        def forward_cuda(self, x, residual=None):
            calls.append(x.shape)
            return super().forward_cuda(x, residual)

    torch.manual_seed(5)
    hq, hkv, d, t = 4, 2, 128, 6
    rotary = RotaryEmbedding(d, {"rope_type": "default", "rope_theta": 10000.0}).cuda()
    q_norm, k_norm = CountingNorm(d, 1e-6).cuda(), RMSNorm(d, 1e-6).cuda()
    qkv = torch.randn(t, (hq + 2 * hkv) * d, device="cuda")
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    want_q, want_k = rotary(torch.arange(t, device="cuda"), q_norm(q.clone()), k_norm(k.clone()))
    calls.clear()
    got_q, got_k = rotary.rotate_normed(torch.arange(t, device="cuda"), q, k, q_norm, k_norm)
    assert len(calls) == 1 and got_q.data_ptr() != q.data_ptr()
    _close(got_q, want_q.cpu(), 1e-5)
    _close(got_k, want_k.cpu(), 1e-5)
