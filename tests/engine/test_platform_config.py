"""Platform-driven configuration: backend validation at config time, filled-in classes, and
the platform interface in vLLM's shape (classmethod hooks, ``worker_cls == "auto"``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkless.config import EngineArgs
from forkless.worker.worker import Worker


def test_unknown_attention_backend_fails_at_config_time_listing_names(llama_dir: Path) -> None:
    with pytest.raises(ValueError) as info:
        EngineArgs(model=str(llama_dir), attention_backend="no-such-kernel").create_engine_config()
    message = str(info.value)
    assert "--attention-backend" in message and "no-such-kernel" in message
    assert "torch" in message and "triton" in message  # the registered names are listed


def test_platform_fills_worker_and_communicator(llama_dir: Path) -> None:
    config = EngineArgs(model=str(llama_dir)).create_engine_config()
    assert config.parallel_config.worker_cls == "forkless.worker.worker:Worker"
    # gloo between CPU worker processes (tensor parallelism); built only with -tp > 1
    assert config.parallel_config.device_communicator_cls == "forkless.distributed.gloo:GlooCommunicator"
    explicit = EngineArgs(model=str(llama_dir)).create_engine_config()
    explicit.parallel_config.worker_cls = "pkg.mod:MyWorker"
    from forkless.platforms import current_platform

    current_platform.check_and_update_config(explicit)
    assert explicit.parallel_config.worker_cls == "pkg.mod:MyWorker"  # the user's choice stays


def test_cuda_platform_prefers_triton_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    from forkless.platforms import cuda
    from forkless.platforms.cuda import CudaPlatform

    # (triton_available() asks once a process: the platform's answer is what is switched.)
    monkeypatch.setattr(cuda, "triton_available", lambda: True)
    assert CudaPlatform().default_attention_backend == "triton"
    assert CudaPlatform().get_attn_backend_cls(None).endswith("triton_paged:TritonAttentionBackend")
    assert CudaPlatform().get_attn_backend_cls("torch").endswith("torch_sdpa:TorchAttentionBackend")
    monkeypatch.setattr(cuda, "triton_available", lambda: False)
    assert CudaPlatform().default_attention_backend == "torch"


# vLLM's shape: hooks are classmethods, the worker is "auto" until the platform says.


class PlatformWorker(Worker):
    """A platform's own worker class."""


VLLM_CLASSMETHODS = (
    "check_and_update_config", "pre_register_and_update", "verify_model_arch", "verify_quantization",
    "get_attn_backend_cls", "get_device_communicator_cls", "seed_everything", "get_device_name",
    "get_device_total_memory", "get_device_capability", "has_device_capability", "get_cpu_architecture",
    "is_pin_memory_available", "inference_mode", "set_device", "import_kernels", "supports_fp8",
    "use_all_gather", "check_max_model_len", "device_id_to_physical_device_id", "validate_request",
)


def test_hooks_are_classmethods_as_in_vllm_and_the_enum_is_importable() -> None:
    from forkless import platforms
    from forkless.platforms.cpu import CpuPlatform
    from forkless.platforms.cuda import CudaPlatform
    from forkless.platforms.interface import Platform, PlatformEnum

    for name in VLLM_CLASSMETHODS + ("total_memory_bytes", "free_memory_bytes", "torch_device", "is_available"):
        assert isinstance(Platform.__dict__[name], classmethod), name
    assert platforms.PlatformEnum is PlatformEnum and {"CPU", "CUDA", "OOT"} <= set(PlatformEnum.__members__)
    assert CpuPlatform().is_cpu() and CudaPlatform().is_cuda() and not CpuPlatform().is_out_of_tree()
    assert CpuPlatform.get_attn_backend_cls(None).endswith(":CpuAttentionBackend")  # on the class, too
    assert CpuPlatform.total_memory_bytes() == CpuPlatform.get_device_total_memory() > 0


def test_check_and_update_config_sees_auto_and_the_worker_follows_the_platform(
        llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from forkless import platforms
    from forkless.config import ParallelConfig
    from forkless.platforms.cpu import CpuPlatform
    from forkless.worker.worker import create_worker

    seen: list[tuple[str, object]] = []

    class VllmStyle(CpuPlatform):
        worker_cls = f"{__name__}:PlatformWorker"

        @classmethod
        def verify_model_arch(cls, model_arch: str) -> None:
            seen.append(("arch", model_arch))

        @classmethod
        def check_and_update_config(cls, vllm_config) -> None:  # no super(): vLLM's base does nothing
            seen.append(("worker_cls", vllm_config.parallel_config.worker_cls))

    assert ParallelConfig().worker_cls == "auto"
    monkeypatch.setattr(platforms, "_current", VllmStyle())
    config = EngineArgs(model=str(llama_dir)).create_engine_config()
    assert seen == [("arch", "LlamaForCausalLM"), ("worker_cls", "auto")]
    assert config.parallel_config.worker_cls == "auto"
    assert type(create_worker(config)) is PlatformWorker  # "auto" left over: the platform's worker_cls
    config.parallel_config.worker_cls = "forkless.worker.worker.Worker"  # vLLM's dotted spelling
    assert type(create_worker(config)) is Worker


def test_a_platforms_own_backends_are_selectable_by_name_without_registration() -> None:
    from forkless.platforms.cpu import CpuPlatform

    class WithKernel(CpuPlatform):
        name = "with_kernel"
        attention_backends = {"mine": "pkg.mod:MyBackend"}
        default_attention_backend = "mine"

    assert WithKernel.get_attn_backend_cls(None) == "pkg.mod:MyBackend"
    assert WithKernel().attention_backend_path("mine") == "pkg.mod:MyBackend"
    assert WithKernel.attention_backend_path("torch").endswith(":TorchAttentionBackend")
    with pytest.raises(KeyError) as info:
        WithKernel.attention_backend_path("nope")
    assert "torch" in str(info.value) and "the with_kernel platform's own: mine" in str(info.value)


def test_vllm_defaults_that_ported_code_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    from forkless.platforms.cuda import CudaPlatform
    from forkless.platforms.interface import DeviceCapability, Platform

    class Quantized(Platform):
        device_name = "QDevice"
        supported_quantization = ["gptq"]

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(8, 9)

    Quantized.verify_quantization("gptq")
    with pytest.raises(ValueError, match="awq quantization is currently not supported in QDevice"):
        Quantized.verify_quantization("awq")
    assert Quantized.has_device_capability(89) and Quantized.has_device_capability((8, 0))
    assert not Quantized.has_device_capability(90) and not Platform.has_device_capability(10)
    assert Quantized.name == "Quantized" and Quantized().get_device_name() == "QDevice"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert CudaPlatform.device_id_to_physical_device_id(1) == 1 and CudaPlatform.device_id_to_physical_device_id(0) == 3
    assert Platform.device_id_to_physical_device_id(1) == 1  # no device variable
    with pytest.raises(NotImplementedError, match="get_device_total_memory"):
        Platform.total_memory_bytes()
