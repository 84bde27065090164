"""Where stat loggers come from: the ``forkless.stat_logger_plugins`` entry-point group.

Invariants:
    * The group is read when :func:`load_stat_logger_plugin_factories` is called, so the
      ``FORKLESS_PLUGINS`` allow-list in force at that moment applies.
    * A plugin whose value is not a ``StatLoggerBase`` subclass is an error naming the
      plugin and the expected interface, never a logger that fails later.
"""

from __future__ import annotations

from typing import Any

from forkless.metrics.interface import StatLoggerBase
from forkless.plugins import STAT_LOGGER_PLUGINS_GROUP, load_plugins_by_group


def load_stat_logger_plugin_factories() -> list[type[StatLoggerBase]]:
    """The stat-logger classes installed as ``forkless.stat_logger_plugins`` entry points.

    Returns:
        The classes, in entry-point name order (plugins that failed to import are left out
        and logged by the loader, or abort under ``FORKLESS_PLUGINS_STRICT=1``).

    Raises:
        TypeError: A plugin's value is not a ``StatLoggerBase`` subclass.
    """
    factories: list[type[StatLoggerBase]] = []
    for name, cls in load_plugins_by_group(STAT_LOGGER_PLUGINS_GROUP).items():
        factories.append(_check_class(cls, f"stat logger plugin {name!r}"))
    return factories


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
