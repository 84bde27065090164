"""The attention-backend registry: lookup, errors, and the base-class check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from forkless.attention import (
    AttentionBackend,
    available_attention_backends,
    get_attention_backend,
    register_attention_backend,
)
from forkless.plugins import RegistryError, Stability, tier_of


class NotABackend:
    pass


class EchoBackend(AttentionBackend):
    name = "echo"

    @classmethod
    def get_kv_cache_shape(cls, num_blocks, block_size, num_kv_heads, head_dim):
        return (num_blocks, 2, block_size, num_kv_heads, head_dim)

    def forward(self, q, k, v, kv_cache, attn_metadata):
        return q.reshape(q.shape[0], -1)


def test_torch_backend_is_builtin():
    backend = get_attention_backend("torch")
    assert issubclass(backend, AttentionBackend)
    assert backend.name == "torch"
    assert backend.get_kv_cache_shape(10, 16, 2, 64) == (2, 10, 16, 2, 64)
    assert "torch" in available_attention_backends()
    assert tier_of(AttentionBackend) is Stability.PROVISIONAL


def test_unknown_name_lists_available():
    with pytest.raises(RegistryError) as info:
        get_attention_backend("no-such-backend")
    message = str(info.value)
    assert "no-such-backend" in message
    assert "torch" in message


def test_non_backend_class_is_rejected():
    register_attention_backend("test-not-a-backend", f"{__name__}:NotABackend")
    try:
        with pytest.raises(TypeError, match="AttentionBackend"):
            get_attention_backend("test-not-a-backend")
    finally:
        from forkless.attention.registry import _registry

        _registry.unregister("test-not-a-backend")


def test_register_by_path_and_object():
    from forkless.attention.registry import _registry

    try:
        register_attention_backend("test-echo", f"{__name__}:EchoBackend")
        assert get_attention_backend("test-echo") is EchoBackend
        register_attention_backend("test-echo-obj", EchoBackend)
        assert get_attention_backend("test-echo-obj") is EchoBackend
    finally:
        _registry.unregister("test-echo")
        _registry.unregister("test-echo-obj")


def test_mismatched_heads_rejected():
    with pytest.raises(ValueError, match="multiple"):
        EchoBackend(num_heads=6, num_kv_heads=4, head_dim=8, scale=1.0)


def test_import_does_not_load_torch():
    code = (
        "import sys; import forkless.attention as a; import forkless.model_loader;"
        "assert 'torch' not in sys.modules, 'torch imported';"
        "assert 'torch' in a.available_attention_backends()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
