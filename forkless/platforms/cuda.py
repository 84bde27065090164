"""The built-in CUDA platform.

Invariants: :meth:`CudaPlatform.is_available` answers without importing torch (importing
torch and making a CUDA context cost the API server seconds): no device node, or NVML's
device count (``forkless.platforms.nvml``) and the torch build's own version file; only
where NVML cannot answer does it ask torch. Everything else imports torch when called,
never at module level.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

from forkless.platforms.interface import DeviceCapability, Platform, PlatformEnum, classproperty
from forkless.triton_utils import triton_available

if TYPE_CHECKING:
    import torch


def torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA build, read from its files (no import).

    A CPU build of torch on a machine with a GPU cannot use it; the version file every
    torch build ships says which build it is.
    """
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    version = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        with open(version, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return True  # cannot tell: let torch decide when the worker starts
    for line in text.splitlines():
        if line.startswith("cuda"):
            return "None" not in line.split("=", 1)[-1]
    return True


class CudaPlatform(Platform):
    """NVIDIA GPUs through torch's CUDA runtime."""

    _enum = PlatformEnum.CUDA
    name = "cuda"
    device_type = "cuda"
    device_name = "cuda"
    dispatch_key = "CUDA"
    ray_device_key = "GPU"
    dist_backend = "nccl"
    device_communicator_cls = "forkless.distributed.nccl:NcclCommunicator"
    device_control_env_var = "CUDA_VISIBLE_DEVICES"

    @classproperty
    def default_attention_backend(cls) -> str:  # type: ignore[override]
        # The paged Triton kernels when Triton is installed; the reference otherwise.
        return "triton" if triton_available() else "torch"

    @classmethod
    def is_available(cls) -> bool:
        # Cheap checks first: importing torch costs a second and needs no GPU.
        if importlib.util.find_spec("torch") is None:
            return False
        if not (os.path.exists("/dev/nvidiactl") or os.environ.get("CUDA_VISIBLE_DEVICES")):
            return False
        # NVML answers without torch or a CUDA context (the API server asks this first
        # thing; torch + CUDA would cost it seconds before the engine core starts).
        from forkless.platforms.nvml import visible_gpu_count

        count = visible_gpu_count()
        if count is not None:
            return count > 0 and torch_has_cuda()
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
