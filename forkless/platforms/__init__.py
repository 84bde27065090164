"""Platforms: ``from forkless.platforms import Platform, current_platform``.

``current_platform`` is resolved on first access, not at import, so that plugins are
loaded first and the choice can see them.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from forkless.platforms.interface import Platform

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

            _current = resolve_current_platform()
        return _current


def __getattr__(name: str) -> Any:
    if name == "current_platform":
        return get_current_platform()
    raise AttributeError(f"module 'forkless.platforms' has no attribute {name!r}")


__all__ = ["Platform", "current_platform", "get_current_platform"]
