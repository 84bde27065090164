"""Where stat loggers come from: the ``forkless.stat_logger_plugins`` entry-point group.

Invariants:
    * The group is read when :func:`load_stat_logger_plugin_factories` is called, so the
      ``FORKLESS_PLUGINS`` allow-list in force at that moment applies.
    * A plugin that cannot be a logger (not a ``StatLoggerBase`` subclass, an abstract
      method left, a constructor that does not take ``(vllm_config, engine_index)``) is
      left out with a warning naming it and what was expected, as any failing plugin is
      (``FORKLESS_PLUGINS_STRICT=1``: an error), never a logger that fails later.
"""

from __future__ import annotations

import inspect
from typing import Any

from forkless.metrics.interface import StatLoggerBase
from forkless.plugins import STAT_LOGGER_PLUGINS_GROUP, load_plugins_by_group, reject_plugin


def load_stat_logger_plugin_factories() -> list[type[StatLoggerBase]]:
    """The stat-logger classes installed as ``forkless.stat_logger_plugins`` entry points.

    Returns:
        The classes, in entry-point name order; plugins that failed to import, or are no
        usable logger class, are left out and logged.

    Raises:
        PluginLoadError: Under ``FORKLESS_PLUGINS_STRICT=1``, a plugin that is no usable
            logger class (one that failed to import raises from the loader).
    """
    factories: list[type[StatLoggerBase]] = []
    for name, cls in load_plugins_by_group(STAT_LOGGER_PLUGINS_GROUP).items():
        source = f"stat logger plugin {name!r}"
        try:
            factories.append(_check_logger_class(cls, source))
        except TypeError as exc:
            reject_plugin(STAT_LOGGER_PLUGINS_GROUP, name, str(exc))
    return factories


def _check_logger_class(cls: Any, source: str) -> type[StatLoggerBase]:
    """``cls``, when forkless can build it as ``cls(vllm_config, engine_index)``."""
    cls = _check_class(cls, source)
    name = f"{cls.__module__}.{cls.__qualname__}"
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise TypeError(f"{source}: {name} does not implement {', '.join(missing)} "
                        "(StatLoggerBase's abstract methods)")
    try:
        inspect.signature(cls).bind(None, 0)
    except TypeError as exc:
        raise TypeError(f"{source}: {name} cannot be built as {cls.__qualname__}(vllm_config, engine_index): "
                        f"{exc}") from None
    except ValueError:
        pass  # no signature to read (a C type): its construction will tell
    return cls


def make_stat_logger(item: Any, config: Any, source: str, engine_index: int = 0) -> StatLoggerBase:
    """An instance from a ``StatLoggerBase`` subclass (constructed) or instance (as is).

    Args:
        item: The class or the instance.
        config: The engine configuration passed to a class's constructor.
        source: Where ``item`` came from, for the error message.
        engine_index: Which engine core the logger reports on.

    Raises:
        TypeError: ``item`` is neither.
        RuntimeError: Its constructor raised (the message names ``source``).
    """
    if isinstance(item, StatLoggerBase):
        return item
    cls = _check_class(item, source)
    try:
        # Both positionally, as vLLM calls a factory: loggers written for it name the
        # second parameter ``engine_idx``, forkless's ``engine_index``.
        return cls(config, engine_index)
    except Exception as e:
        raise RuntimeError(f"{source}: {cls.__module__}.{cls.__qualname__}(config, {engine_index}) raised "
                           f"{type(e).__name__}: {e}") from e


def _check_class(item: Any, source: str) -> type[StatLoggerBase]:
    if isinstance(item, type) and issubclass(item, StatLoggerBase):
        return item
    raise TypeError(f"{source}: {item!r} is not a forkless.metrics.StatLoggerBase subclass or instance")
