"""Resolution of ``--scheduler-cls``."""

from __future__ import annotations

from typing import Any

from forkless.core.sched.interface import SchedulerInterface
from forkless.plugins import resolve_class


def get_scheduler_cls(path: str | type[Any] | None) -> type[SchedulerInterface]:
    """The scheduler class to instantiate.

    Args:
        path: ``--scheduler-cls``: a class path (``"pkg.mod:Cls"`` or ``"pkg.mod.Cls"``),
            a class, or ``None`` for the built-in continuous-batching scheduler.

    Returns:
        A :class:`SchedulerInterface` subclass. A custom one logs, once, that the
        interface is internal and may change.

    Raises:
        ValueError: ``path`` is not a well-formed class path.
        forkless.plugins.PluginImportError: The path does not import.
        TypeError: The class does not subclass ``SchedulerInterface``.
    """
    if path is None:
        from forkless.core.sched.scheduler import Scheduler

        return Scheduler
    cls: type[SchedulerInterface] = resolve_class(path, SchedulerInterface, "--scheduler-cls")
    return cls
