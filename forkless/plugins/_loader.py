"""Loading plugins by entry-point group, with the rules of DESIGN.md §2.

One implementation serves every group: filtering by ``FORKLESS_PLUGINS``, deterministic
order, ``Requires-Dist`` compatibility, per-plugin failure isolation (or abort under
``FORKLESS_PLUGINS_STRICT=1``), opt-in groups, and load timing.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from forkless import envs
from forkless.logger import init_logger
from forkless.plugins._discovery import EntryPointInfo, discover_entry_points
from forkless.plugins._registry import import_path

logger = init_logger("forkless.plugins")

GENERAL_PLUGINS_GROUP = "forkless.general_plugins"
PLATFORM_PLUGINS_GROUP = "forkless.platform_plugins"
STAT_LOGGER_PLUGINS_GROUP = "forkless.stat_logger_plugins"
IO_PROCESSOR_PLUGINS_GROUP = "forkless.io_processor_plugins"
LOGITS_PROCESSOR_GROUP = "forkless.logits_processors"
ENDPOINT_PLUGINS_GROUP = "forkless.endpoint_plugins"


@dataclass(frozen=True)
class GroupSpec:
    """How a group's entry points are used."""

    name: str
    loaded_in: str
    value: str
    opt_in: bool = False


GROUPS: dict[str, GroupSpec] = {
    g.name: g
    for g in (
        GroupSpec(GENERAL_PLUGINS_GROUP, "every process", "zero-argument callable that registers things"),
        GroupSpec(PLATFORM_PLUGINS_GROUP, "every process", "zero-argument callable returning a Platform class path or None"),
        GroupSpec(STAT_LOGGER_PLUGINS_GROUP, "API server", "a StatLoggerBase subclass"),
        GroupSpec(IO_PROCESSOR_PLUGINS_GROUP, "API server", "zero-argument callable returning an IOProcessor class path or None"),
        GroupSpec(LOGITS_PROCESSOR_GROUP, "workers (validated in the API server)", "a LogitsProcessor subclass"),
        GroupSpec(ENDPOINT_PLUGINS_GROUP, "API server", "zero-argument factory returning an object with attach_router(app)", opt_in=True),
    )
}


class PluginLoadError(RuntimeError):
    """A plugin failed while ``FORKLESS_PLUGINS_STRICT=1`` was set."""


@dataclass
class PluginRecord:
    """What happened to one plugin in this process (shown by ``forkless plugins list``)."""

    group: str
    name: str
    value: str
    dist: str
    version: str
    status: str = "discovered"  # loaded | filtered | opt-in | failed | incompatible
    error: str | None = None
    load_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _State:
    lock: threading.RLock = field(default_factory=threading.RLock)
    entries: list[EntryPointInfo] | None = None
    records: dict[tuple[str, str], PluginRecord] = field(default_factory=dict)
    loaded: dict[tuple[str, str], Any] = field(default_factory=dict)
    warned_unknown: bool = False
    hinted: set[tuple[str, str]] = field(default_factory=set)
    general_done: bool = False


_state = _State()


def _reset_for_tests() -> None:
    """Forget everything loaded in this process (tests only)."""
    global _state
    _state = _State()


# -- environment ------------------------------------------------------------------------


def allowed_plugin_names() -> set[str] | None:
    """``FORKLESS_PLUGINS`` parsed: ``None`` when unset (all but opt-in), else the names."""
    raw = envs.FORKLESS_PLUGINS
    if raw is None:
        return None
    return {n.strip() for n in raw.split(",") if n.strip()}


def strict_mode() -> bool:
    return envs.FORKLESS_PLUGINS_STRICT


def installed_entry_points() -> list[EntryPointInfo]:
    """Every installed forkless entry point (discovered once per process)."""
    with _state.lock:
        if _state.entries is None:
            _state.entries = discover_entry_points()
            _warn_unknown_names(_state.entries)
        return _state.entries


def _warn_unknown_names(entries: list[EntryPointInfo]) -> None:
    allowed = allowed_plugin_names()
    if not allowed or _state.warned_unknown:
        return
    _state.warned_unknown = True
    available = sorted({e.name for e in entries})
    for name in sorted(allowed - set(available)):
        logger.warning(
            "FORKLESS_PLUGINS names %r, but no installed plugin has that name; installed "
            "plugins: %s", name, ", ".join(available) or "(none)",
        )


def _forkless_version() -> str:
    from forkless.version import __version__

    return __version__


def incompatibility(entry: EntryPointInfo) -> str | None:
    """Why the plugin's distribution cannot run with this forkless, or ``None``."""
    if not entry.requires:
        return None
    # packaging costs ~50 ms to import; only plugins that declare a forkless
    # requirement pay for it.
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    running = _forkless_version()
    for line in entry.requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower().replace("_", "-") != "forkless":
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            ok = req.specifier.contains(Version(running), prereleases=True)
        except InvalidVersion:
            ok = True
        if not ok:
            return (
                f"{entry.dist} {entry.version} requires forkless{req.specifier}, but the "
                f"running forkless is {running}"
            )
    return None


# -- loading ----------------------------------------------------------------------------


def load_entry_point_value(value: str) -> Any:
    """Import what an entry point's value (``"pkg.mod:attr [extra]"``) names.

    Same result as ``importlib.metadata.EntryPoint.load()``, without importing
    ``importlib.metadata`` (about 90 ms in every process).
    """
    value = value.split("[", 1)[0].strip()
    if ":" not in value:
        import importlib

        return importlib.import_module(value)
    return import_path(value)


def _fail(record: PluginRecord, status: str, message: str, tb: str | None) -> None:
    record.status = status
    record.error = message
    detail = f"\n{tb}" if tb else ""
    if strict_mode():
        logger.error("plugin %r from distribution %s %s: %s%s", record.name, record.dist,
                     record.version, message, detail)
        raise PluginLoadError(
            f"plugin {record.name!r} (group {record.group}, distribution {record.dist} "
            f"{record.version}): {message} (FORKLESS_PLUGINS_STRICT=1 aborts startup)"
        )
    logger.warning("plugin %r from distribution %s %s is skipped: %s%s", record.name,
                   record.dist, record.version, message, detail)


def _selected(entry: EntryPointInfo, allowed: set[str] | None) -> str | None:
    """``None`` when the entry should load, else its status (filtered / opt-in)."""
    spec = GROUPS.get(entry.group)
    if spec is not None and spec.opt_in:
        return None if allowed and entry.name in allowed else "opt-in"
    if allowed is None or entry.name in allowed:
        return None
    return "filtered"


def load_plugins_by_group(group: str) -> dict[str, Any]:
    """Load the entry points of one group that ``FORKLESS_PLUGINS`` allows.

    Loading imports the entry point's object; it does not call it. A plugin that fails
    to import, or whose distribution requires another forkless version, is logged
    (name, distribution, traceback) and left out, unless ``FORKLESS_PLUGINS_STRICT=1``.

    Args:
        group: An entry-point group, e.g. ``"forkless.general_plugins"``.

    Returns:
        ``{entry point name: loaded object}``, ordered by name.

    Raises:
        PluginLoadError: In strict mode, the first plugin that fails.
    """
    allowed = allowed_plugin_names()
    out: dict[str, Any] = {}
    with _state.lock:
        entries = [e for e in installed_entry_points() if e.group == group]
        for entry in sorted(entries, key=lambda e: e.name):
            key = (group, entry.name)
            if key in _state.loaded:
                out[entry.name] = _state.loaded[key]
                continue
            record = _state.records.get(key)
            if record is None:
                record = PluginRecord(group, entry.name, entry.value, entry.dist, entry.version)
                _state.records[key] = record
            skip = _selected(entry, allowed)
            if skip is not None:
                record.status = skip
                if skip == "opt-in" and key not in _state.hinted:
                    _state.hinted.add(key)
                    logger.warning(
                        "endpoint plugin %r (distribution %s) is installed but not enabled; "
                        "add it to FORKLESS_PLUGINS to enable it (e.g. FORKLESS_PLUGINS=%s)",
                        entry.name, entry.dist, entry.name,
                    )
                continue
            if record.status in ("failed", "incompatible"):
                continue
            reason = incompatibility(entry)
            if reason is not None:
                _fail(record, "incompatible", reason, None)
                continue
            start = time.perf_counter()
            try:
                obj = load_entry_point_value(entry.value)
            except Exception as exc:
                record.load_ms = (time.perf_counter() - start) * 1e3
                _fail(record, "failed", f"import of {entry.value!r} failed: "
                      f"{type(exc).__name__}: {exc}", traceback.format_exc())
                continue
            record.load_ms = (time.perf_counter() - start) * 1e3
            record.status = "loaded"
            _state.loaded[key] = obj
            out[entry.name] = obj
            logger.debug("loaded plugin %r (%s) in %.1f ms", entry.name, group, record.load_ms)
    return out


def call_plugin(group: str, name: str, func: Callable[[], Any]) -> tuple[bool, Any]:
    """Call a loaded plugin callable, with timing and failure isolation.

    Returns:
        ``(ok, result)``; ``ok`` is False when the call raised (and strict mode is off).
    """
    record = _state.records.get((group, name))
    start = time.perf_counter()
    try:
        result = func()
    except Exception as exc:
        if record is not None:
            record.load_ms = (record.load_ms or 0.0) + (time.perf_counter() - start) * 1e3
            _fail(record, "failed", f"calling it raised {type(exc).__name__}: {exc}",
                  traceback.format_exc())
        else:
            logger.warning("plugin %r raised", name, exc_info=True)
        _state.loaded.pop((group, name), None)
        return False, None
    if record is not None:
        record.load_ms = (record.load_ms or 0.0) + (time.perf_counter() - start) * 1e3
    return True, result


def load_general_plugins() -> None:
    """Load and call every allowed ``forkless.general_plugins`` entry point.

    Runs at most once per process; later calls return at once. Every process calls it
    at its start, because processes are spawned and inherit no registrations.
    """
    with _state.lock:
        if _state.general_done:
            return
        _state.general_done = True
        for name, func in load_plugins_by_group(GENERAL_PLUGINS_GROUP).items():
            if not callable(func):
                record = _state.records[(GENERAL_PLUGINS_GROUP, name)]
                _fail(record, "failed", f"{record.value!r} is {type(func).__name__}, not a "
                      "zero-argument callable", None)
                continue
            call_plugin(GENERAL_PLUGINS_GROUP, name, func)


def plugin_records() -> list[PluginRecord]:
    """What this process knows of every installed plugin (all groups, sorted)."""
    with _state.lock:
        allowed = allowed_plugin_names()
        for entry in installed_entry_points():
            key = (entry.group, entry.name)
            if key not in _state.records:
                rec = PluginRecord(entry.group, entry.name, entry.value, entry.dist, entry.version)
                rec.status = _selected(entry, allowed) or "discovered"
                _state.records[key] = rec
        return [r for _, r in sorted(_state.records.items())]
