"""Platforms: ``from forkless.platforms import Platform, PlatformEnum, current_platform``.

Invariants: ``current_platform`` is resolved on first access, not at import, so that
plugins are loaded first and the choice can see them (a platform plugin's module imports
this package to subclass ``Platform``); it is resolved once per process, and the chosen
platform's ``pre_register_and_update()`` runs once, before anything reads it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from forkless.platforms.interface import CpuArchEnum, Platform, PlatformEnum

if TYPE_CHECKING:
    current_platform: Platform

_lock = threading.Lock()
_current: Platform | None = None


def get_current_platform() -> Platform:
    """The platform of this process, chosen on first call (see :mod:`forkless.platforms.registry`)."""
    global _current
    with _lock:
        if _current is None:
            from forkless.platforms.registry import resolve_current_platform

            platform = resolve_current_platform()
            # vLLM calls it before any configuration exists; so does forkless, in every
            # process, without a CLI parser to extend.
            platform.pre_register_and_update(None)
            _current = platform
        return _current


def __getattr__(name: str) -> Any:
    if name == "current_platform":
        return get_current_platform()
    raise AttributeError(f"module 'forkless.platforms' has no attribute {name!r}")


__all__ = ["CpuArchEnum", "Platform", "PlatformEnum", "current_platform", "get_current_platform"]
