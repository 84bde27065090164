"""The built-in CUDA platform."""

from __future__ import annotations

import importlib.util
import os

from forkless.platforms.interface import Platform


class CudaPlatform(Platform):
    name = "cuda"
    device_type = "cuda"

    @property
    def default_attention_backend(self) -> str:  # type: ignore[override]
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

    @property
    def device_name(self) -> str:  # type: ignore[override]
        import torch

        return torch.cuda.get_device_name(0)

    def total_memory_bytes(self, index: int = 0) -> int:
        import torch

        return int(torch.cuda.get_device_properties(index).total_memory)

    def free_memory_bytes(self, index: int = 0) -> int:
        import torch

        free, _total = torch.cuda.mem_get_info(index)
        return int(free)

    def seed_everything(self, seed: int | None) -> None:
        super().seed_everything(seed)
        if seed is not None:
            import torch

            torch.cuda.manual_seed_all(seed)
