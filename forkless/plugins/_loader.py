"""Loading plugins by entry-point group, with the rules of DESIGN.md §2.

Invariants:
    * :data:`GROUPS` is the one description of the entry-point groups (what the value is,
      where it loads, whether it is opt-in, which interface a class must subclass);
      ``forkless plugins check`` / ``list`` and the docs derive from it.
    * ``FORKLESS_PLUGINS`` is parsed in one place (:func:`plugin_selection`): unset = every
      plugin but the opt-in (endpoint) ones; ``a,b`` = only those; ``+a,+b`` = the default
      set plus those; empty = none.
    * One implementation serves every group: deterministic order (by entry-point name),
      ``Requires-Dist`` compatibility, per-plugin failure isolation and load timing.
    * A failing plugin is logged exactly once, with its name, distribution, version,
      message and traceback. Under ``FORKLESS_PLUGINS_STRICT=1`` every plugin of the group
      is still tried, and then one :class:`PluginLoadError` names all that failed; it is
      raised outside any ``except`` block and its message holds no traceback, so nothing
      is printed twice.
"""

from __future__ import annotations

import enum
import multiprocessing
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from forkless import envs
from forkless.logger import init_logger
from forkless.plugins._discovery import (
    EntryPointInfo,
    discover_entry_points,
    left_in_vllm_groups,
    vllm_group_entry_points,
    vllm_group_hint,
)
from forkless.plugins._registry import PluginImportError, import_path, registering_as
from forkless.plugins._requires import UNDECIDED, check_plain

logger = init_logger("forkless.plugins")

GENERAL_PLUGINS_GROUP = "forkless.general_plugins"
#: vLLM's name for the general plugins' group.
DEFAULT_PLUGINS_GROUP = GENERAL_PLUGINS_GROUP
PLATFORM_PLUGINS_GROUP = "forkless.platform_plugins"
STAT_LOGGER_PLUGINS_GROUP = "forkless.stat_logger_plugins"
IO_PROCESSOR_PLUGINS_GROUP = "forkless.io_processor_plugins"
LOGITS_PROCESSOR_GROUP = "forkless.logits_processors"
ENDPOINT_PLUGINS_GROUP = "forkless.endpoint_plugins"


class ValueKind(str, enum.Enum):
    """What an entry point's value must be."""

    CALLABLE = "callable"  # forkless calls it with no arguments
    CLASS = "class"  # forkless uses the class itself (and instantiates it where it runs)


@dataclass(frozen=True)
class GroupSpec:
    """How a group's entry points are used (one row of the docs' group table).

    Attributes:
        name: The entry-point group.
        loaded_in: Which processes load it, in words.
        value: What the entry point's value must be, in words.
        kind: Whether the value is called or used as a class.
        interface: For class groups, the class path the value must subclass.
        opt_in: Loaded only when ``FORKLESS_PLUGINS`` names it.
        detector: A callable whose ``None`` result means "not active on this machine";
            such a plugin's status is ``inactive``.
        returns: For detector groups, the class path that the class path the callable
            returns must name a subclass of (``forkless plugins check`` imports it).
    """

    name: str
    loaded_in: str
    value: str
    kind: ValueKind
    interface: str | None = None
    opt_in: bool = False
    detector: bool = False
    returns: str | None = None


GROUPS: dict[str, GroupSpec] = {
    g.name: g
    for g in (
        GroupSpec(GENERAL_PLUGINS_GROUP, loaded_in="every process",
                  value="zero-argument callable that registers things",
                  kind=ValueKind.CALLABLE),
        GroupSpec(PLATFORM_PLUGINS_GROUP, loaded_in="every process",
                  value="zero-argument callable returning a Platform class path or None",
                  kind=ValueKind.CALLABLE, detector=True, returns="forkless.platforms:Platform"),
        GroupSpec(STAT_LOGGER_PLUGINS_GROUP, loaded_in="API server",
                  value="a StatLoggerBase subclass",
                  kind=ValueKind.CLASS, interface="forkless.metrics:StatLoggerBase"),
        GroupSpec(IO_PROCESSOR_PLUGINS_GROUP, loaded_in="API server",
                  value="zero-argument callable returning an IOProcessor class path or None",
                  kind=ValueKind.CALLABLE, detector=True, returns="forkless.io_processors:IOProcessor"),
        GroupSpec(LOGITS_PROCESSOR_GROUP, loaded_in="workers (validated in the API server)",
                  value="a LogitsProcessor subclass",
                  kind=ValueKind.CLASS, interface="forkless.logits_processors:LogitsProcessor"),
        GroupSpec(ENDPOINT_PLUGINS_GROUP, loaded_in="API server",
                  value="zero-argument factory returning an object with attach_router(app)",
                  kind=ValueKind.CALLABLE, opt_in=True),
    )
}


def _format_failures(records: Sequence[PluginRecord]) -> str:
    lines = [f"{len(records)} plugin(s) failed and FORKLESS_PLUGINS_STRICT=1 aborts startup "
             "(each traceback is logged above):"]
    lines += [f"  - {r.name!r} (group {r.group}, distribution {r.dist} {r.version}): {r.error}"
              for r in records]
    return "\n".join(lines)


class PluginLoadError(RuntimeError):
    """Plugins failed while ``FORKLESS_PLUGINS_STRICT=1`` was set.

    Attributes:
        records: The failed plugins (empty when raised for another reason).
    """

    def __init__(self, message: str, records: Sequence[PluginRecord] = ()) -> None:
        super().__init__(message)
        self.records: tuple[PluginRecord, ...] = tuple(records)

    @classmethod
    def for_records(cls, records: Sequence[PluginRecord]) -> PluginLoadError:
        """One error naming every failed plugin, with its message but no traceback."""
        return cls(_format_failures(records), records)


@dataclass
class PluginRecord:
    """What happened to one plugin in this process (shown by ``forkless plugins list``)."""

    group: str
    name: str
    value: str
    dist: str
    version: str
    # loaded | inactive | filtered | opt-in | failed | incompatible | unknown-group;
    # "discovered": installed, not (yet) loaded by this process.
    status: str = "discovered"
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


@dataclass(frozen=True)
class PluginSelection:
    """``FORKLESS_PLUGINS`` parsed.

    Attributes:
        entries: The non-empty entries as written (``"+example_hello"``), in order.
        names: The plugin names the entries mention (``+`` stripped).
        additive: Every entry is ``+name`` (or the variable is unset): the default set
            loads, plus the names. Otherwise the names are the whole allow-list.
    """

    entries: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()
    additive: bool = True

    @classmethod
    def parse(cls, raw: str | None) -> PluginSelection:
        """Parse the variable's raw text (``None`` when unset).

        Entries are separated by commas; whitespace around them and around a name after
        ``+`` is ignored. Unset = the default set; empty = nothing.
        """
        if raw is None:
            return cls()
        entries = tuple(e.strip() for e in raw.split(",") if e.strip())
        names = frozenset(n for n in (e.lstrip("+").strip() for e in entries) if n)
        # An empty value (no entries) is an allow-list of nothing, never "the default".
        additive = bool(entries) and all(e.startswith("+") for e in entries)
        return cls(entries, names, additive)

    def allows(self, name: str, opt_in: bool) -> bool:
        """Whether a plugin of this name loads (``opt_in``: its group is off by default)."""
        return name in self.names or (self.additive and not opt_in)

    def enabling(self, name: str) -> str:
        """The ``FORKLESS_PLUGINS`` value that keeps this selection and also loads ``name``."""
        return ",".join((*self.entries, f"+{name}" if self.additive else name))


def plugin_selection() -> PluginSelection:
    """``FORKLESS_PLUGINS`` parsed (see :class:`PluginSelection`)."""
    return PluginSelection.parse(envs.FORKLESS_PLUGINS)


def strict_mode() -> bool:
    """Whether ``FORKLESS_PLUGINS_STRICT=1``: a failing plugin aborts startup."""
    return envs.FORKLESS_PLUGINS_STRICT


def is_opt_in(group: str) -> bool:
    """Whether plugins of ``group`` load only when ``FORKLESS_PLUGINS`` names them."""
    spec = GROUPS.get(group)
    return spec is not None and spec.opt_in


def installed_entry_points() -> list[EntryPointInfo]:
    """Every installed forkless entry point (discovered once per process)."""
    with _state.lock:
        if _state.entries is None:
            _state.entries = discover_entry_points()
            _warn_unknown_names(_state.entries)
        return _state.entries


def _warn_unknown_names(entries: list[EntryPointInfo]) -> None:
    selection = plugin_selection()
    if not selection.names or _state.warned_unknown:
        return
    _state.warned_unknown = True
    available = sorted({e.name for e in entries})
    found = None  # the vllm.* entry points: read once, and only for a name that is not installed
    for entry in selection.entries:
        name = entry.lstrip("+").strip()
        if not name or name in available:
            continue
        found = vllm_group_entry_points() if found is None else found
        hint = vllm_group_hint([name], found)
        logger.warning(
            "FORKLESS_PLUGINS names %r, but no installed plugin has that name;%s installed "
            "plugins: %s%s", entry, _did_you_mean(entry, name, available),
            ", ".join(available) or "(none)", f". {hint}" if hint else "",
        )


def _did_you_mean(entry: str, name: str, available: list[str]) -> str:
    # difflib costs an import; only a misspelled FORKLESS_PLUGINS pays for it.
    import difflib

    close = difflib.get_close_matches(name, available, n=1)
    if not close:
        return ""
    prefix = entry[: len(entry) - len(entry.lstrip("+"))]
    return f" did you mean {prefix + close[0]!r}?"


def _forkless_version() -> str:
    from forkless.version import __version__

    return __version__


def incompatibility(entry: EntryPointInfo) -> str | None:
    """Why the plugin's distribution cannot run with this forkless, or ``None``."""
    if not entry.requires:
        return None
    running = _forkless_version()
    for line in entry.requires:
        # The plain forms are decided without packaging (~12 ms to import): see _requires.
        verdict = check_plain(line, running)
        if verdict is None:
            continue
        if verdict is not UNDECIDED:
            return f"{entry.dist} {entry.version} requires forkless{verdict}, but the running forkless is {running}"
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.version import InvalidVersion, Version

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


def _fail(record: PluginRecord, status: str, message: str, tb: str | None) -> PluginRecord:
    """Mark ``record`` failed and log it, once, with its traceback; never raises.

    Returns:
        The record, for the caller's list of failures (see :func:`_raise_if_strict`).
    """
    record.status = status
    record.error = message
    detail = f"\n{tb.rstrip()}" if tb else ""
    if strict_mode():
        logger.error("plugin %r from distribution %s %s failed: %s%s", record.name,
                     record.dist, record.version, message, detail)
    else:
        logger.warning("plugin %r from distribution %s %s is skipped: %s%s", record.name,
                       record.dist, record.version, message, detail)
    return record


def reject_plugin(group: str, name: str, message: str) -> None:
    """Mark a plugin that imported but is unusable (its family's check refused its value)
    as failed, as a plugin that failed to import is: ``plugins list`` shows it, and it is
    logged once per process. Under ``FORKLESS_PLUGINS_STRICT=1`` that is an error.

    Raises:
        PluginLoadError: In strict mode.
    """
    with _state.lock:
        record = _state.records.get((group, name))
        if record is None:  # not from an entry point (tests build values by hand)
            record = PluginRecord(group, name, "?", "?", "?")
            _state.records[(group, name)] = record
        if record.status != "failed":
            _fail(record, "failed", message, None)
    _raise_if_strict([record])


def _raise_if_strict(failed: Sequence[PluginRecord]) -> None:
    # Called outside every ``except`` block, so Python does not chain (and print again)
    # the plugin's exception under ours.
    if failed and strict_mode():
        raise PluginLoadError.for_records(failed)


def _record_for(entry: EntryPointInfo) -> PluginRecord:
    key = (entry.group, entry.name)
    record = _state.records.get(key)
    if record is None:
        record = PluginRecord(entry.group, entry.name, entry.value, entry.dist, entry.version)
        _state.records[key] = record
    return record


def _selected(entry: EntryPointInfo, selection: PluginSelection) -> str | None:
    """``None`` when the entry should load, else its status (filtered / opt-in)."""
    opt_in = is_opt_in(entry.group)
    if selection.allows(entry.name, opt_in):
        return None
    return "opt-in" if opt_in else "filtered"


def _hint_opt_in(entry: EntryPointInfo, selection: PluginSelection) -> None:
    key = (entry.group, entry.name)
    if key in _state.hinted:
        return
    _state.hinted.add(key)
    logger.warning(
        "endpoint plugin %r (distribution %s) is installed but not enabled; enable it "
        "with FORKLESS_PLUGINS=%s", entry.name, entry.dist, selection.enabling(entry.name),
    )


def _load_one(entry: EntryPointInfo, record: PluginRecord) -> tuple[bool, Any]:
    """Import one selected entry point; ``(False, None)`` when it failed (and was logged)."""
    reason = incompatibility(entry)
    if reason is not None:
        _fail(record, "incompatible", reason, None)
        return False, None
    start = time.perf_counter()
    try:
        obj = load_entry_point_value(entry.value)
    except Exception as exc:
        record.load_ms = (time.perf_counter() - start) * 1e3
        # import_path's own message already names the path and the underlying failure.
        message = str(exc) if isinstance(exc, PluginImportError) else (
            f"import of {entry.value!r} failed: {type(exc).__name__}: {exc}")
        _fail(record, "failed", message, traceback.format_exc())
        return False, None
    record.load_ms = (time.perf_counter() - start) * 1e3
    record.status = "loaded"
    logger.debug("loaded plugin %r (%s) in %.1f ms", entry.name, entry.group, record.load_ms)
    return True, obj


def _load_group(group: str) -> tuple[dict[str, Any], list[PluginRecord]]:
    """Import every selected entry point of ``group``; never raises.

    Returns:
        ``({name: loaded object}, records of the plugins that failed now)``.
    """
    selection = plugin_selection()
    out: dict[str, Any] = {}
    failed: list[PluginRecord] = []
    with _state.lock:
        entries = [e for e in installed_entry_points() if e.group == group]
        for entry in sorted(entries, key=lambda e: e.name):
            key = (group, entry.name)
            record = _record_for(entry)
            # The allow-list in force now decides, even for a plugin an earlier call
            # loaded under another FORKLESS_PLUGINS: only the import itself is cached.
            skip = _selected(entry, selection)
            if skip is not None:
                record.status = skip
                if skip == "opt-in":
                    _hint_opt_in(entry, selection)
                continue
            if key in _state.loaded:
                if record.status in ("filtered", "opt-in"):
                    record.status = "loaded"
                out[entry.name] = _state.loaded[key]
                continue
            if record.status in ("failed", "incompatible"):
                continue  # already logged (and raised, in strict mode) in this process
            ok, obj = _load_one(entry, record)
            if not ok:
                failed.append(record)
                continue
            _state.loaded[key] = obj
            out[entry.name] = obj
    return out, failed


def load_plugins_by_group(group: str) -> dict[str, Any]:
    """Load the entry points of one group that ``FORKLESS_PLUGINS`` allows.

    Loading imports the entry point's object; it does not call it. A plugin that fails
    to import, or whose distribution requires another forkless version, is logged
    (name, distribution, traceback) and left out.

    Args:
        group: An entry-point group, e.g. ``"forkless.general_plugins"``.

    Returns:
        ``{entry point name: loaded object}``, ordered by name.

    Raises:
        PluginLoadError: In strict mode, after trying every plugin of the group; it
            names each one that failed.
    """
    out, failed = _load_group(group)
    _raise_if_strict(failed)
    return out


def _call(group: str, name: str, func: Callable[[], Any]) -> tuple[bool, Any, PluginRecord | None]:
    """Call one loaded plugin; never raises.

    Returns:
        ``(ok, result, the failed record or None)``.
    """
    record = _state.records.get((group, name))
    start = time.perf_counter()
    try:
        with registering_as(f"plugin {name!r} of {group}"):
            result = func()
    except Exception as exc:
        _state.loaded.pop((group, name), None)
        if record is None:
            logger.warning("plugin %r raised", name, exc_info=True)
            return False, None, None
        record.load_ms = (record.load_ms or 0.0) + (time.perf_counter() - start) * 1e3
        return False, None, _fail(record, "failed", f"calling it raised {type(exc).__name__}: "
                                  f"{exc}", traceback.format_exc())
    if record is not None:
        record.load_ms = (record.load_ms or 0.0) + (time.perf_counter() - start) * 1e3
        spec = GROUPS.get(group)
        if spec is not None and spec.detector:
            # A detector that returns None is healthy but has nothing to offer here.
            record.status = "inactive" if result is None else "loaded"
    return True, result, None


def call_plugin(group: str, name: str, func: Callable[[], Any]) -> tuple[bool, Any]:
    """Call a loaded plugin callable, with timing and failure isolation.

    A detector group's plugin (platform, IO processor) that returns ``None`` is recorded
    as ``inactive``.

    Returns:
        ``(ok, result)``; ``ok`` is False when the call raised (and strict mode is off).

    Raises:
        PluginLoadError: In strict mode, when the call raised (logged once, before).
    """
    ok, result, failed = _call(group, name, func)
    _raise_if_strict([failed] if failed is not None else [])
    return ok, result


def _call_group(group: str) -> tuple[dict[str, Any], list[PluginRecord]]:
    loaded, failed = _load_group(group)
    results: dict[str, Any] = {}
    for name, func in loaded.items():
        record = _state.records[(group, name)]
        if not callable(func):
            _state.loaded.pop((group, name), None)
            failed.append(_fail(record, "failed", f"{record.value!r} is "
                                f"{type(func).__name__}, not a zero-argument callable", None))
            continue
        ok, result, failure = _call(group, name, func)
        if failure is not None:
            failed.append(failure)
        if ok:
            results[name] = result
    return results, failed


def call_plugins_by_group(group: str) -> dict[str, Any]:
    """Load and call every allowed plugin of a callable group.

    Args:
        group: A group whose values are zero-argument callables.

    Returns:
        ``{entry point name: what the call returned}`` for the calls that succeeded.

    Raises:
        PluginLoadError: In strict mode, after every plugin of the group was tried; it
            names each one that failed to import or raised.
    """
    with _state.lock:
        results, failed = _call_group(group)
    _raise_if_strict(failed)
    return results


def load_general_plugins() -> None:
    """Load and call every allowed ``forkless.general_plugins`` entry point.

    Runs at most once per process; later calls return at once. Every process calls it
    at its start, because processes are spawned and inherit no registrations.

    Raises:
        PluginLoadError: In strict mode, naming every general plugin that failed.
    """
    with _state.lock:
        if _state.general_done:
            return
        _state.general_done = True
        _, failed = _call_group(GENERAL_PLUGINS_GROUP)
        left = left_in_vllm_groups()
    # A plugin ported from vLLM that kept its entry-point groups would do nothing, unsaid:
    # said once, by the process the user started (not again by each spawned one).
    if left and multiprocessing.parent_process() is None:
        logger.warning("%s", vllm_group_hint(found=left))
    _raise_if_strict(failed)


def unknown_group_message(group: str) -> str:
    """Why an entry point in ``group``, which is not one of :data:`GROUPS`, is never loaded:
    the group named, with the closest real one (a typo such as ``forkless.general_plugin``)."""
    import difflib

    close = difflib.get_close_matches(group, list(GROUPS), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else f"the groups are {', '.join(sorted(GROUPS))}"
    return f"forkless reads no entry-point group {group!r}, so this plugin never loads ({hint})"


def plugin_records() -> list[PluginRecord]:
    """What this process knows of every installed plugin (all groups, sorted)."""
    with _state.lock:
        selection = plugin_selection()
        for entry in installed_entry_points():
            key = (entry.group, entry.name)
            if key not in _state.records:
                rec = PluginRecord(entry.group, entry.name, entry.value, entry.dist, entry.version)
                rec.status = _selected(entry, selection) or "discovered"
                if entry.group not in GROUPS:
                    rec.status, rec.error = "unknown-group", unknown_group_message(entry.group)
                _state.records[key] = rec
        return [r for _, r in sorted(_state.records.items())]
