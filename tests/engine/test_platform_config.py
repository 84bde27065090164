"""Platform-driven configuration: backend validation at config time, filled-in classes."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkless.config import EngineArgs


def test_unknown_attention_backend_fails_at_config_time_listing_names(llama_dir: Path) -> None:
    with pytest.raises(ValueError) as info:
        EngineArgs(model=str(llama_dir), attention_backend="no-such-kernel").create_engine_config()
    message = str(info.value)
    assert "--attention-backend" in message and "no-such-kernel" in message
    assert "torch" in message and "triton" in message  # the registered names are listed


def test_platform_fills_worker_and_communicator(llama_dir: Path) -> None:
    config = EngineArgs(model=str(llama_dir)).create_engine_config()
    assert config.parallel_config.worker_cls == "forkless.worker.worker:Worker"
    assert config.parallel_config.device_communicator_cls is None  # the CPU needs none
    explicit = EngineArgs(model=str(llama_dir)).create_engine_config()
    explicit.parallel_config.worker_cls = "pkg.mod:MyWorker"
    from forkless.platforms import current_platform

    current_platform.check_and_update_config(explicit)
    assert explicit.parallel_config.worker_cls == "pkg.mod:MyWorker"  # the user's choice stays


def test_cuda_platform_prefers_triton_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from forkless.platforms.cuda import CudaPlatform

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else real(name, *a))
    assert CudaPlatform().default_attention_backend == "triton"
    assert CudaPlatform().get_attn_backend_cls(None).endswith("triton_paged:TritonAttentionBackend")
    assert CudaPlatform().get_attn_backend_cls("torch").endswith("torch_sdpa:TorchAttentionBackend")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert CudaPlatform().default_attention_backend == "torch"
