"""Stability tiers of extension interfaces, and class-path resolution for config values.

Invariants:
    * An interface's tier is always a :class:`Stability` member: :func:`stability` rejects
      anything else, so a misspelled tier is an error where it is written, never a silent
      default.
    * A class selected by configuration is checked against its interface before use, and
      a custom implementation of an internal interface is warned about once per class.
"""

from __future__ import annotations

import enum
import logging
import multiprocessing
from typing import Any, Callable, TypeVar

from forkless.plugins._registry import PluginImportError, check_implements, import_path

logger = logging.getLogger("forkless.plugins")

C = TypeVar("C", bound=type)


class Stability(str, enum.Enum):
    """How much an extension interface promises to its implementers.

    PUBLIC interfaces follow the deprecation policy; PROVISIONAL ones may change after an
    announcement; INTERNAL ones may change in any release, and selecting a custom
    implementation logs a warning once.
    """

    PUBLIC = "public"
    PROVISIONAL = "provisional"
    INTERNAL = "internal"


def stability(tier: Stability) -> Callable[[C], C]:
    """Class decorator that marks an extension interface with its tier.

    Args:
        tier: A :class:`Stability` member (``Stability.PUBLIC``...).

    Raises:
        TypeError: ``tier`` is anything else, a string included; the message names the
            accepted values.
    """
    if not isinstance(tier, Stability):
        accepted = ", ".join(f"Stability.{member.name}" for member in Stability)
        raise TypeError(f"stability() takes a Stability member ({accepted}), got {tier!r}")

    def mark(cls: C) -> C:
        cls.__forkless_stability__ = tier  # type: ignore[attr-defined]
        return cls

    return mark


def tier_of(cls: type) -> Stability:
    """The tier of an interface (or of the interface a class implements)."""
    return getattr(cls, "__forkless_stability__", Stability.PROVISIONAL)


_warned_internal: set[str] = set()


def resolve_class(path: Any, base: type[Any], what: str, builtin_prefix: str = "forkless.") -> Any:
    """Resolve a class named by configuration (``--scheduler-cls a.b.C``).

    Args:
        path: A class path string, or a class (passed through the same checks).
        base: The interface the class must subclass.
        what: What the value configures, for messages ("--scheduler-cls").
        builtin_prefix: Classes from modules under this prefix are built-ins and do not
            trigger the internal-interface warning.

    Returns:
        The class.

    Raises:
        ValueError: ``path`` is not a well-formed class path.
        PluginImportError: The path does not import (message names path and cause).
        TypeError: The object is not a class, not a subclass of ``base``, or leaves
            abstract methods of ``base`` unimplemented (named in the message).
    """
    base_name = f"{base.__module__}.{base.__qualname__}"
    if isinstance(path, str):
        try:
            cls = import_path(path)
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
        except PluginImportError as exc:
            raise PluginImportError(f"{what}: {exc}") from exc
    else:
        cls = path
    if not isinstance(cls, type):
        raise TypeError(f"{what}: {path!r} is {cls!r}, not a class; expected a subclass of {base_name}")
    if not issubclass(cls, base):
        raise TypeError(f"{what}: {cls.__module__}.{cls.__qualname__} is not a subclass of {base_name}")
    name = f"{cls.__module__}.{cls.__qualname__}"
    check_implements(cls, what)
    if tier_of(base) is Stability.INTERNAL and not cls.__module__.startswith(builtin_prefix):
        # Once per run: in the process the user started (the engine core, spawned, builds
        # the same class again).
        if name not in _warned_internal and multiprocessing.parent_process() is None:
            _warned_internal.add(name)
            logger.warning(
                "%s selects the custom class %s; the %s interface is internal and may "
                "change in any forkless release",
                what, name, base.__qualname__,
            )
    return cls
