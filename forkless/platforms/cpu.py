"""The built-in CPU platform (always available)."""

from __future__ import annotations

import os
import platform as _platform

from forkless.platforms.interface import Platform


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    device_name = _platform.processor() or _platform.machine() or "cpu"
    # The torch reference plus a compiled C decode kernel (the reference path without a
    # C compiler).
    default_attention_backend = "cpu"

    def total_memory_bytes(self, index: int = 0) -> int:
        try:
            return _meminfo("MemTotal")
        except (OSError, KeyError):
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def free_memory_bytes(self, index: int = 0) -> int:
        try:
            return _meminfo("MemAvailable")
        except (OSError, KeyError):
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
