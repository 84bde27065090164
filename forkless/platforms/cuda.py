"""The built-in CUDA platform.

Invariants: :meth:`CudaPlatform.is_available` answers without importing torch when the
machine plainly has no GPU (importing torch costs a second); everything else imports
torch when called, never at module level.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

from forkless.platforms.interface import DeviceCapability, Platform, PlatformEnum, classproperty

if TYPE_CHECKING:
    import torch


class CudaPlatform(Platform):
    """NVIDIA GPUs through torch's CUDA runtime."""

    _enum = PlatformEnum.CUDA
    name = "cuda"
    device_type = "cuda"
    device_name = "cuda"
    dispatch_key = "CUDA"
    ray_device_key = "GPU"
    dist_backend = "nccl"
    device_control_env_var = "CUDA_VISIBLE_DEVICES"

    @classproperty
    def default_attention_backend(cls) -> str:  # type: ignore[override]
        # The paged Triton kernels when Triton is installed; the reference otherwise.
        return "triton" if importlib.util.find_spec("triton") is not None else "torch"

    @classmethod
    def is_available(cls) -> bool:
        # Cheap checks first: importing torch costs a second and needs no GPU.
        if importlib.util.find_spec("torch") is None:
            return False
        if not (os.path.exists("/dev/nvidiactl") or os.environ.get("CUDA_VISIBLE_DEVICES")):
            return False
        import torch

        return bool(torch.cuda.is_available())

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        import torch

        return torch.cuda.get_device_name(device_id)

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        import torch

        return DeviceCapability(*torch.cuda.get_device_capability(device_id))

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        import torch

        return int(torch.cuda.get_device_properties(device_id).total_memory)

    @classmethod
    def free_memory_bytes(cls, index: int = 0) -> int:
        import torch

        free, _total = torch.cuda.mem_get_info(index)
        return int(free)

    @classmethod
    def set_device(cls, device: "torch.device") -> None:
        import torch

        torch.cuda.set_device(device)

    @classmethod
    def seed_everything(cls, seed: int | None = None) -> None:
        super().seed_everything(seed)
        if seed is not None:
            import torch

            torch.cuda.manual_seed_all(seed)

    @classmethod
    def supports_fp8(cls) -> bool:
        return cls.has_device_capability(89)
