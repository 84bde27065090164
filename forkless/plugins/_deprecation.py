"""The deprecation policy of DESIGN.md §4, one mechanism for four kinds of names.

A CLI flag, an environment variable, an HTTP request field or a Python API goes through
three stages:

1. deprecated: still works, warns once naming the version that removes it;
2. off by default: using it is an error unless re-enabled with
   ``FORKLESS_ALLOW_DEPRECATED=<name>[,<name>...]``;
3. removed: using it is an error naming the replacement — never silently ignored.
"""

from __future__ import annotations

import enum
import functools
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, TypeVar

from forkless import envs
from forkless.logger import init_logger

logger = init_logger("forkless.deprecation")

F = TypeVar("F", bound=Callable[..., Any])


class DeprecationKind(str, enum.Enum):
    CLI_FLAG = "CLI flag"
    ENV_VAR = "environment variable"
    HTTP_FIELD = "HTTP request field"
    PYTHON_API = "Python API"


class DeprecatedError(ValueError):
    """A deprecated name was used past the stage where it still works."""


@dataclass(frozen=True)
class Deprecation:
    """One deprecated name and where it stands.

    Args:
        kind: What the name is.
        name: ``--flag``, ``ENV_VAR``, ``field`` (or ``endpoint:field``), ``module.func``.
        replacement: What to use instead (shown in every message), or ``None``.
        deprecated_in: The version that deprecated it.
        removed_in: The version that turns it off (stage 2) or removed it (stage 3).
        stage: 1, 2 or 3.
    """

    kind: DeprecationKind
    name: str
    replacement: str | None
    deprecated_in: str
    removed_in: str
    stage: int = 1

    def __post_init__(self) -> None:
        if self.stage not in (1, 2, 3):
            raise ValueError(f"deprecation stage must be 1, 2 or 3, got {self.stage!r}")

    def _instead(self) -> str:
        return f"; use {self.replacement} instead" if self.replacement else ""

    def message(self) -> str:
        k = self.kind.value
        if self.stage == 1:
            return (f"{k} {self.name} is deprecated since forkless {self.deprecated_in} and "
                    f"will be removed in {self.removed_in}{self._instead()}")
        if self.stage == 2:
            return (f"{k} {self.name} is deprecated and off since forkless {self.removed_in}"
                    f"{self._instead()} (set FORKLESS_ALLOW_DEPRECATED={self.name} to "
                    "re-enable it until it is removed)")
        return f"{k} {self.name} was removed in forkless {self.removed_in}{self._instead()}"


def _reenabled() -> set[str]:
    raw = envs.FORKLESS_ALLOW_DEPRECATED
    return {n.strip() for n in raw.split(",") if n.strip()}


class DeprecationRegistry:
    """The deprecated names, and the checks every entry point calls."""

    def __init__(self) -> None:
        self._items: dict[tuple[DeprecationKind, str], Deprecation] = {}
        self._warned: set[tuple[DeprecationKind, str]] = set()
        self._lock = threading.Lock()

    def add(self, item: Deprecation) -> Deprecation:
        self._items[(item.kind, item.name)] = item
        return item

    def get(self, kind: DeprecationKind, name: str) -> Deprecation | None:
        return self._items.get((kind, name))

    def items(self, kind: DeprecationKind | None = None) -> list[Deprecation]:
        return [d for d in self._items.values() if kind is None or d.kind is kind]

    def use(self, kind: DeprecationKind, name: str) -> None:
        """Record that ``name`` is being used: warn once (stage 1) or raise (2 and 3).

        Raises:
            DeprecatedError: Stage 3, or stage 2 without ``FORKLESS_ALLOW_DEPRECATED``.
        """
        item = self._items.get((kind, name))
        if item is None:
            return
        if item.stage == 3 or (item.stage == 2 and name not in _reenabled()):
            raise DeprecatedError(item.message())
        with self._lock:
            if (kind, name) in self._warned:
                return
            self._warned.add((kind, name))
        logger.warning("%s", item.message())

    # The four front doors ------------------------------------------------------------
    def check_cli_args(self, argv: Iterable[str]) -> None:
        """Check command-line arguments (``--flag`` and ``--flag=value`` forms)."""
        for arg in argv:
            if arg.startswith("--"):
                self.use(DeprecationKind.CLI_FLAG, arg.split("=", 1)[0])

    def check_environ(self, environ: Mapping[str, str] | None = None) -> None:
        """Check the process environment for deprecated variables."""
        env = os.environ if environ is None else environ
        for item in self.items(DeprecationKind.ENV_VAR):
            if item.name in env:
                self.use(DeprecationKind.ENV_VAR, item.name)

    def check_http_fields(self, endpoint: str, body: Mapping[str, Any]) -> None:
        """Check a request body; names may be ``field`` or ``endpoint:field``."""
        for key in body:
            self.use(DeprecationKind.HTTP_FIELD, key)
            self.use(DeprecationKind.HTTP_FIELD, f"{endpoint}:{key}")

    def python_api(self, replacement: str | None, deprecated_in: str, removed_in: str,
                   stage: int = 1, name: str | None = None) -> Callable[[F], F]:
        """Decorator deprecating a function or class constructor."""

        def wrap(func: F) -> F:
            full = name or f"{func.__module__}.{func.__qualname__}"
            self.add(Deprecation(DeprecationKind.PYTHON_API, full, replacement,
                                 deprecated_in, removed_in, stage))

            @functools.wraps(func)
            def inner(*args: Any, **kwargs: Any) -> Any:
                self.use(DeprecationKind.PYTHON_API, full)
                return func(*args, **kwargs)

            return inner  # type: ignore[return-value]

        return wrap


DEPRECATIONS = DeprecationRegistry()
"""The registry forkless itself checks (CLI, environment, HTTP server, Python API)."""

# Removed from forkless itself: an error naming them, never silently ignored.
# FORKLESS_DECODE_OVERLAP_MIN_BATCH (decode graphs as two halves on two streams) measured
# slower than one stream and went (benchmarks/README.md).
DEPRECATIONS.add(Deprecation(DeprecationKind.ENV_VAR, "FORKLESS_DECODE_OVERLAP_MIN_BATCH", None,
                             "0.1.0", "0.1.0", stage=3))
