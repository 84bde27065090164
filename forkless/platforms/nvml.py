"""How many NVIDIA GPUs this process may use, asked of NVML without importing torch.

Invariants: never imports torch and never initialises CUDA (the API server asks this to
choose its platform, and importing torch plus a CUDA context costs it seconds before the
engine core can even start); returns ``None`` when NVML cannot answer (no driver library,
an NVML error), so that the caller falls back to asking torch.

``CUDA_VISIBLE_DEVICES`` is read the way the CUDA runtime reads it for the cases that
decide "none" versus "some": unset means every device; empty, or a list whose first entry
is not a valid device, means none.
"""

from __future__ import annotations

import ctypes
import os

_NVML_SUCCESS = 0


def visible_gpu_count() -> int | None:
    """GPUs visible to this process, or ``None`` when NVML is not there to ask."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        if nvml.nvmlInit_v2() != _NVML_SUCCESS:
            return None
        try:
            count = ctypes.c_uint(0)
            if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != _NVML_SUCCESS:
                return None
            return _apply_visible_devices(count.value, os.environ.get("CUDA_VISIBLE_DEVICES"))
        finally:
            nvml.nvmlShutdown()
    except AttributeError:  # a driver library without these entry points
        return None


def _apply_visible_devices(physical: int, visible: str | None) -> int:
    """How many of ``physical`` devices ``CUDA_VISIBLE_DEVICES`` leaves visible."""
    if visible is None:
        return physical
    entries = [e.strip() for e in visible.split(",")]
    count = 0
    for entry in entries:
        # The runtime stops at the first entry that names no device.
        if entry.isdigit():
            if int(entry) >= physical:
                break
        elif not entry.startswith(("GPU-", "MIG-")):
            break
        count += 1
    return count
