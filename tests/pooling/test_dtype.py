"""``--dtype auto`` for pooling models on the CPU: bfloat16 where the CPU computes it
natively (as vLLM downcasts float32 pooling checkpoints), float32 elsewhere and for
generative models."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkless import cpu_kernels
from forkless.config import EngineArgs


@pytest.mark.parametrize("flags,want", [
    ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
    ({"avx2", "amx_tile", "amx_bf16"}, "bfloat16"),
    ({"avx2", "avx512f"}, "float32"),  # AVX-512 without BF16: emulated 16-bit is slower
    ({"avx2", "fma"}, "float32"),
])
def test_auto_dtype_of_a_pooling_model_follows_the_cpu(monkeypatch, minilm: Path, tiny_llama: Path, flags, want):
    from forkless import platforms

    if not platforms.current_platform.is_cpu():
        pytest.skip("the rule is the CPU platform's (on a GPU auto is the checkpoint's dtype)")
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: frozenset(flags))
    assert EngineArgs(model=str(minilm)).create_engine_config().model_config.dtype == want
    assert EngineArgs(model=str(minilm), dtype="float32").create_engine_config().model_config.dtype == "float32"
    # A generative model keeps float32 on the CPU whatever the CPU has; pooled, it follows the rule.
    assert EngineArgs(model=str(tiny_llama)).create_engine_config().model_config.dtype == "float32"
    pooled = EngineArgs(model=str(tiny_llama), convert="embed").create_engine_config()
    assert pooled.model_config.dtype == want
