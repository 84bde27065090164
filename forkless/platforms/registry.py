"""Choosing the current platform (docs/architecture.md §5, platform plugins).

Order: ``FORKLESS_PLATFORM`` forces one by name; otherwise an out-of-tree platform whose
detector returns a class path wins (two such are an error naming both); otherwise the
first available built-in (cuda, then cpu). A detector that raises is a warning (an error
under ``FORKLESS_PLUGINS_STRICT=1``), never a silent fallback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forkless import envs
from forkless.logger import init_logger
from forkless.plugins import (
    PLATFORM_PLUGINS_GROUP,
    call_plugin,
    call_plugins_by_group,
    import_path,
    load_plugins_by_group,
)

if TYPE_CHECKING:
    from forkless.platforms.interface import Platform

logger = init_logger("forkless.platforms")

BUILTIN_PLATFORMS = {
    "cuda": "forkless.platforms.cuda:CudaPlatform",
    "cpu": "forkless.platforms.cpu:CpuPlatform",
}


class PlatformError(RuntimeError):
    """The platform could not be chosen unambiguously."""


def _detect_out_of_tree() -> dict[str, str]:
    """``{plugin name: platform class path}`` of the platform plugins that activate."""
    # A detector that raised is logged with its traceback by the loader and left out (in
    # strict mode: every failing detector is named in one error).
    results = call_plugins_by_group(PLATFORM_PLUGINS_GROUP)
    return {name: path for name, path in results.items() if path is not None}


def _instantiate(path: str, source: str) -> "Platform":
    from forkless.platforms.interface import Platform

    cls = import_path(path)
    if not (isinstance(cls, type) and issubclass(cls, Platform)):
        raise PlatformError(f"{source} returned {path!r}, which is not a subclass of "
                            "forkless.platforms.Platform")
    return cls()


def resolve_current_platform() -> "Platform":
    """Pick and instantiate the platform for this process.

    Raises:
        PlatformError: ``FORKLESS_PLATFORM`` names an unknown or absent platform, or two
            out-of-tree platforms are active.
    """
    forced = envs.FORKLESS_PLATFORM
    if forced:
        return _forced_platform(forced)
    active = _detect_out_of_tree()
    if len(active) > 1:
        names = " and ".join(f"{n!r} ({p})" for n, p in sorted(active.items()))
        raise PlatformError(f"more than one out-of-tree platform is active: {names}; set "
                            "FORKLESS_PLATFORM=<name> to choose one")
    if active:
        name, path = next(iter(active.items()))
        platform = _instantiate(path, f"platform plugin {name!r}")
        logger.info("using out-of-tree platform %s (%r) from plugin %r", path, platform.name, name)
        return platform
    for name, path in BUILTIN_PLATFORMS.items():
        cls = import_path(path)
        if cls.is_available():
            logger.debug("using built-in platform %r", name)
            return cls()
    raise PlatformError("no platform is available")  # cpu is always available


def _forced_platform(forced: str) -> "Platform":
    detectors = load_plugins_by_group(PLATFORM_PLUGINS_GROUP)
    if forced in detectors:
        ok, path = call_plugin(PLATFORM_PLUGINS_GROUP, forced, detectors[forced])
        if not ok or path is None:
            raise PlatformError(f"FORKLESS_PLATFORM={forced}: the plugin's device is not "
                                "available on this machine (its detector returned None or raised)")
        return _instantiate(path, f"platform plugin {forced!r}")
    if forced in BUILTIN_PLATFORMS:
        cls = import_path(BUILTIN_PLATFORMS[forced])
        if not cls.is_available():
            raise PlatformError(f"FORKLESS_PLATFORM={forced}: that device is not available")
        return cls()
    choices = sorted(set(BUILTIN_PLATFORMS) | set(detectors))
    raise PlatformError(f"FORKLESS_PLATFORM={forced!r} names no platform; available: "
                        f"{', '.join(choices)}")
