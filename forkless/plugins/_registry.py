"""The lazy name -> class registry that every forkless registry is built on.

A registry stores *paths* (``"pkg.mod:Class"``; ``"pkg.mod.Class"`` is accepted too) and
imports a class only when :meth:`LazyRegistry.resolve` first asks for it, in the process
that asks. Plugins run in every process (API server, engine core, workers), so
registration must be cheap and must not drag model code or torch into processes that
never use it.

Conflict rule (documented in ``docs/plugins.md``): registering a name again with the same
target is a no-op, which keeps plugins re-entrant; registering it with a *different*
target logs a warning and the newest registration wins, so a plugin can deliberately
replace a built-in.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Generic, Iterator, TypeVar

logger = logging.getLogger("forkless.plugins")

T = TypeVar("T")

_ALL_REGISTRIES: "weakref.WeakValueDictionary[str, LazyRegistry[Any]]" = (
    weakref.WeakValueDictionary()
)
# Lists that :func:`recording_registrations` blocks are filling, innermost last.
_RECORDERS: list[list[tuple[str, str]]] = []
# Who registers now (the plugin loader's calls, :func:`registering_as`), innermost last.
_REGISTRANTS: list[str] = []


class RegistryError(KeyError):
    """An unknown name was asked of a registry. ``str()`` lists the registered names."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class PluginImportError(ImportError):
    """A registered path (or a class path from configuration) could not be imported."""


def split_path(path: str) -> tuple[str, str]:
    """Split ``"pkg.mod:Attr.sub"`` or ``"pkg.mod.Attr"`` into module and attribute.

    Args:
        path: A class path in either accepted spelling.

    Returns:
        ``(module_name, attribute_path)``.

    Raises:
        ValueError: The string is not a dotted path.
    """
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"expected a class path like 'pkg.module:Class', got {path!r}")
    path = path.strip()
    if ":" in path:
        module, _, attr = path.partition(":")
    else:
        module, _, attr = path.rpartition(".")
    if not module or not attr or " " in path:
        raise ValueError(
            f"expected a class path like 'pkg.module:Class' or 'pkg.module.Class', got {path!r}"
        )
    return module, attr


def canonical_path(path: str) -> str:
    """The ``"pkg.mod:Attr"`` spelling of a path, so that both spellings compare equal."""
    module, attr = split_path(path)
    return f"{module}:{attr}"


def import_path(path: str) -> Any:
    """Import the object a class path names.

    Args:
        path: ``"pkg.mod:Class"`` or ``"pkg.mod.Class"``.

    Returns:
        The object.

    Raises:
        PluginImportError: The module failed to import or lacks the attribute; the message
            names the path and the underlying failure.
    """
    module_name, attr = split_path(path)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise PluginImportError(
            f"cannot import {path!r}: importing module {module_name!r} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise PluginImportError(
                f"cannot import {path!r}: module {module_name!r} has no attribute {attr!r}{_suggest(obj, part)}"
            ) from exc
    return obj


def _suggest(owner: Any, missing: str) -> str:
    """``"; did you mean 'X'?"`` for a misspelt name, else what ``owner`` has that a path
    may name: its classes, and the functions it defines itself (a path may name a function:
    ``--middleware``, an entry point's callable), which a list of classes alone left out."""
    names = [n for n in dir(owner) if not n.startswith("_")]
    close = difflib.get_close_matches(missing, names, n=1, cutoff=0.75)
    if close:
        return f"; did you mean {close[0]!r}?"
    classes = sorted(n for n in names if inspect.isclass(getattr(owner, n, None))
                     and getattr(getattr(owner, n), "__module__", "") not in ("typing", "builtins", "abc"))
    # Only its own functions: the ones it imported are not what a path to it means.
    functions = sorted(n for n in names if inspect.isfunction(getattr(owner, n, None))
                       and getattr(getattr(owner, n), "__module__", None) == getattr(owner, "__name__", ""))
    parts = [f"its {kind}: " + ", ".join(found[:12]) + (", ..." if len(found) > 12 else "")
             for kind, found in (("classes", classes), ("functions", functions)) if found]
    return f" ({'; '.join(parts)})" if parts else ""


def check_implements(cls: type, what: str) -> None:
    """Fail now, not at construction, when a class leaves abstract methods unimplemented.

    Args:
        cls: The class a plugin or a flag named.
        what: What it was named for, for the message.

    Raises:
        TypeError: Naming the class and every method it still has to implement.
    """
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise TypeError(f"{what}: {cls.__module__}.{cls.__qualname__} does not implement the "
                        f"abstract method(s) {missing} of its interface")


def describe_target(target: Any) -> str:
    """A stable, human-readable identity for a registry target (used in reports)."""
    if isinstance(target, str):
        return canonical_path(target)
    qualname = getattr(target, "__qualname__", type(target).__qualname__)
    module = getattr(target, "__module__", "?")
    return f"<object {module}:{qualname} at {id(target):#x}>"


class LazyRegistry(Generic[T]):
    """A name -> class registry that imports lazily.

    Args:
        kind: What the registry holds, for messages ("model architecture").
        base: When given, :meth:`resolve` checks the resolved class subclasses it.
        hint: Appended to the unknown-name error (e.g. how to add one with a plugin).
    """

    def __init__(self, kind: str, base: type | None = None, hint: str = "") -> None:
        self.kind = kind
        self.base = base
        self.hint = hint
        self._targets: dict[str, Any] = {}
        self._resolved: dict[str, T] = {}
        self._owners: dict[str, str] = {}  # name -> the plugin that registered it, if one did
        self._lock = threading.RLock()
        _ALL_REGISTRIES[kind] = self

    # -- registration -------------------------------------------------------------------
    def register(self, name: str, target: Any) -> None:
        """Register ``name`` -> ``target`` (a class path, or an object).

        Same name and same target again: no-op. Same name, different target: a warning,
        and the new target wins.

        Args:
            name: The public name (an architecture, a parser name...).
            target: A ``"pkg.mod:Class"`` / ``"pkg.mod.Class"`` path, or the object itself.

        Raises:
            ValueError: ``name`` is empty or ``target`` is a malformed path.
            TypeError: ``target`` is an object that does not subclass the registry's base
                (a path is checked when it is first resolved, since registering never
                imports).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if isinstance(target, str):
            target = canonical_path(target)
        elif self.base is not None and not (isinstance(target, type) and issubclass(target, self.base)):
            what = (f"{target.__module__}.{target.__qualname__}" if isinstance(target, type)
                    else f"{target!r:.200} (an instance, not a class)")
            raise TypeError(f"{self.kind} {name!r}: {what} is not a subclass of "
                            f"{self.base.__module__}.{self.base.__qualname__}")
        for recorder in _RECORDERS:
            recorder.append((self.kind, name))
        with self._lock:
            old = self._targets.get(name)
            if name in self._targets and self._same_target(name, old, target):
                return
            owner = _REGISTRANTS[-1] if _REGISTRANTS else None
            if name in self._targets:
                logger.warning(
                    "%s %r was registered as %s and is now replaced by %s%s (the newest "
                    "registration wins)",
                    self.kind, name, describe_target(old), describe_target(target),
                    f", by {owner}" if owner else "",
                )
            self._targets[name] = target
            if owner:
                self._owners[name] = owner
            else:
                self._owners.pop(name, None)
            self._resolved.pop(name, None)
            if not isinstance(target, str):
                self._resolved[name] = target

    def _same_target(self, name: str, old: Any, new: Any) -> bool:
        if old is new:
            return True
        if isinstance(old, str) and isinstance(new, str):
            return old == new
        # A path and an object are the same target when the path has already been
        # imported and named that object; never import just to compare.
        return isinstance(old, str) and self._resolved.get(name) is new

    def unregister(self, name: str) -> None:
        """Remove ``name`` (no error when absent)."""
        with self._lock:
            self._targets.pop(name, None)
            self._resolved.pop(name, None)
            self._owners.pop(name, None)

    def owner(self, name: str) -> str | None:
        """Who registered ``name``, as ``"plugin 'x' of GROUP"``, when a plugin did;
        ``None`` for built-ins and registrations made outside the plugin loader."""
        return self._owners.get(name)

    def describe(self, name: str) -> str:
        """``name`` and its target for messages, with the plugin that registered it:
        ``"attention backend 'cpu' -> 'pkg.mod:Cls' (registered by plugin 'x' ...)"``."""
        owner = self._owners.get(name)
        return (f"{self.kind} {name!r} -> {describe_target(self._targets.get(name))!r}"
                + (f" (registered by {owner})" if owner else ""))

    # -- lookup -------------------------------------------------------------------------
    def resolve(self, name: str) -> T:
        """Return the class registered under ``name``, importing it on first use.

        Raises:
            RegistryError: ``name`` is not registered; lists the registered names.
            PluginImportError: The registered path does not import.
            TypeError: The class does not subclass the registry's base.
        """
        with self._lock:
            if name in self._resolved:
                return self._resolved[name]
            if name not in self._targets:
                raise RegistryError(self.unknown_message(name))
            path = self._targets[name]
            try:
                obj = import_path(path)
            except PluginImportError as exc:
                owner = self._owners.get(name)
                if owner is None:
                    raise
                raise PluginImportError(f"{exc} ({self.kind} {name!r}, registered by {owner})") from exc
            if self.base is not None and not (
                isinstance(obj, type) and issubclass(obj, self.base)
            ):
                raise TypeError(
                    f"{self.describe(name)} is {obj!r}, which is not a subclass "
                    f"of {self.base.__module__}.{self.base.__qualname__}"
                )
            if self.base is not None:
                check_implements(obj, self.describe(name))
            self._resolved[name] = obj
            return obj

    def unknown_message(self, name: str) -> str:
        names = ", ".join(sorted(self._targets)) or "(none)"
        msg = f"unknown {self.kind} {name!r}; registered: {names}"
        return f"{msg}. {self.hint}" if self.hint else msg

    def get_path(self, name: str) -> str | None:
        """The registered path, or ``None`` for unknown names and object targets."""
        target = self._targets.get(name)
        return target if isinstance(target, str) else None

    def is_imported(self, name: str) -> bool:
        """Whether ``name`` has been resolved (imported) in this process."""
        return name in self._resolved

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._targets)

    def snapshot(self) -> dict[str, str]:
        """``name -> describe_target(target)``; equal snapshots mean nothing changed."""
        with self._lock:
            return {n: describe_target(t) for n, t in sorted(self._targets.items())}

    def __contains__(self, name: object) -> bool:
        return name in self._targets

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._targets)

    def __repr__(self) -> str:
        return f"LazyRegistry({self.kind!r}, {len(self)} names)"


def all_registries() -> dict[str, LazyRegistry[Any]]:
    """Every registry created in this process so far, by kind."""
    return dict(_ALL_REGISTRIES)


@contextmanager
def recording_registrations() -> Iterator[list[tuple[str, str]]]:
    """Collect ``(kind, name)`` of every registration made while the block runs.

    Every call is recorded, a no-op re-registration included: ``forkless plugins check``
    uses it on a plugin's second call, when the registries' modules are already imported
    and only the plugin's own registrations run.

    Yields:
        The list the registrations are appended to, in call order.
    """
    recorded: list[tuple[str, str]] = []
    _RECORDERS.append(recorded)
    try:
        yield recorded
    finally:
        _RECORDERS.remove(recorded)


@contextmanager
def registering_as(who: str) -> Iterator[None]:
    """Attribute the registrations made while the block runs to ``who`` (the plugin
    loader's calls: ``"plugin 'x' of forkless.general_plugins"``), so that a replaced
    built-in and a target that later fails to import name the plugin behind them."""
    _REGISTRANTS.append(who)
    try:
        yield
    finally:
        _REGISTRANTS.pop()


def snapshot_all() -> dict[str, dict[str, str]]:
    """A snapshot of every registry; used by ``forkless plugins check``."""
    return {kind: reg.snapshot() for kind, reg in sorted(all_registries().items())}
