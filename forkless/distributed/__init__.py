"""Distributed execution: device communicators (provisional) and the parallel state.

``from forkless.distributed import DeviceCommunicatorBase`` is the interface a platform's
communicator subclasses; ``forkless.distributed.parallel_state`` holds a worker's process
groups (``get_tp_group()``, ``get_pp_group()``, ``get_world_group()``).

Importing this package does not import torch: the interface is loaded on first access.
"""

from __future__ import annotations

from typing import Any

from forkless.distributed.registry import (
    available_device_communicators,
    register_device_communicator,
    resolve_device_communicator,
)

__all__ = [
    "DeviceCommunicatorBase",
    "available_device_communicators",
    "register_device_communicator",
    "resolve_device_communicator",
]


def __getattr__(name: str) -> Any:
    if name == "DeviceCommunicatorBase":  # imports torch: only where it is used
        from forkless.distributed.interface import DeviceCommunicatorBase

        return DeviceCommunicatorBase
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
