"""The built-in CPU platform (always available).

Invariants: it reads the host's memory from ``/proc/meminfo`` (``sysconf`` elsewhere) on
every call, since what is free changes; it imports nothing heavy at module level.
"""

from __future__ import annotations

import os
import platform as _host
from typing import TYPE_CHECKING, Any

from forkless.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    import torch


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


class CpuPlatform(Platform):
    """The host CPU: forkless's reference device, and a base for CPU-like plugins."""

    _enum = PlatformEnum.CPU
    name = "cpu"
    device_type = "cpu"
    device_name = _host.processor() or _host.machine() or "cpu"
    dispatch_key = "CPU"
    dist_backend = "gloo"
    # Tensor parallelism between CPU worker processes (forkless.distributed).
    device_communicator_cls = "forkless.distributed.gloo:GlooCommunicator"
    device_control_env_var = "CPU_VISIBLE_MEMORY_NODES"
    # The torch reference plus a compiled C decode kernel (the reference path without a
    # C compiler).
    default_attention_backend = "cpu"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        """The host's physical memory (vLLM's CPU platform returns its KV-cache space)."""
        try:
            return _meminfo("MemTotal")
        except (OSError, KeyError):
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    @classmethod
    def free_memory_bytes(cls, index: int = 0) -> int:
        try:
            return _meminfo("MemAvailable")
        except (OSError, KeyError):
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")

    @classmethod
    def set_device(cls, device: "torch.device") -> None:
        """Nothing to select: there is one host."""

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def inference_mode(cls) -> Any:
        import torch

        return torch.no_grad()
