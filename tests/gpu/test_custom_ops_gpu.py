"""Custom ops on the CUDA platform: each built-in op binds forward_cuda, the Triton kernels."""

from __future__ import annotations

import pytest
import torch

from forkless.ops import CustomOp
from forkless.ops.activation import SiluAndMul
from forkless.ops.layernorm import RMSNorm
from forkless.ops.rotary import RotaryEmbedding

ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def _ops() -> list[CustomOp]:
    return [RMSNorm(128), RotaryEmbedding(64, ROPE), SiluAndMul()]


def test_cuda_platform_binds_the_triton_kernels():
    from forkless.ops import fused_triton, kernels
    from forkless.platforms import current_platform

    assert current_platform.is_cuda()
    for op in _ops():
        assert op.implementation == "forward_cuda"
        assert op.forward.__func__ is type(op).forward_cuda
    assert kernels.triton_kernels() is fused_triton


def test_fused_kernels_off_binds_forward_native(monkeypatch):
    monkeypatch.setenv("FORKLESS_FUSED_KERNELS", "0")
    assert {op.implementation for op in _ops()} == {"forward_native"}


def test_custom_ops_turns_one_op_to_forward_native(monkeypatch):
    monkeypatch.setenv("FORKLESS_CUSTOM_OPS", "-rms_norm")
    assert {op.name: op.implementation for op in _ops()} == {
        "rms_norm": "forward_native", "rotary_embedding": "forward_cuda", "silu_and_mul": "forward_cuda"}


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_forward_cuda_equals_forward_native(dtype, tol):
    torch.manual_seed(0)
    dev = "cuda"
    norm = RMSNorm(128, 1e-5, dtype=dtype).to(dev)
    norm.weight.data.normal_(1.0, 0.1)
    x = torch.randn(7, 128, dtype=dtype, device=dev)
    res = torch.randn(7, 128, dtype=dtype, device=dev)
    for got, want in [(norm(x), norm.forward_native(x)),
                      *zip(norm(x, res), norm.forward_native(x, res))]:
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)

    rope = RotaryEmbedding(64, ROPE).to(dev)
    positions = torch.randint(0, 4000, (7,), device=dev)
    q, k = torch.randn(7, 8, 64, dtype=dtype, device=dev), torch.randn(7, 2, 64, dtype=dtype, device=dev)
    want = rope.forward_native(positions, q.clone(), k.clone())
    got = rope(positions, q.clone(), k.clone())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)

    act = SiluAndMul()
    h = torch.randn(7, 2 * 256, dtype=dtype, device=dev)
    torch.testing.assert_close(act(h).float(), act.forward_native(h).float(), rtol=tol, atol=tol)


def test_cpu_tensors_in_a_cuda_process_take_forward_native():
    # forward_cuda is bound, but a CPU tensor (a test's reference, say) cannot go to Triton.
    norm, act = RMSNorm(64), SiluAndMul()
    x = torch.randn(3, 64)
    assert torch.equal(norm(x), norm.forward_native(x))
    assert torch.equal(act(x), act.forward_native(x))
