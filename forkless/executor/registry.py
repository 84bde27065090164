"""The executor registry: ``--distributed-executor-backend NAME|PATH`` -> executor class."""

from __future__ import annotations

from typing import Any

from forkless.executor.interface import Executor
from forkless.plugins import LazyRegistry, resolve_class

_FLAG = "--distributed-executor-backend"

# Built-ins by path: the multiprocess executor is only imported when chosen.
_registry: LazyRegistry[type[Executor]] = LazyRegistry(
    "executor",
    base=Executor,
    hint=f"Pass an Executor subclass to {_FLAG} as pkg.mod:Class, or register a name with "
    "forkless.executor.register_executor(name, 'pkg.mod:Class') from a general plugin.",
)
_registry.register("uni", "forkless.executor.uniproc:UniProcExecutor")
_registry.register("mp", "forkless.executor.multiproc:MultiprocExecutor")
# Imports Ray when chosen (the optional extra forkless[ray]).
_registry.register("ray", "forkless.executor.ray_executor:RayExecutor")


def register_executor(name: str, executor: Any) -> None:
    """Register an executor under a ``--distributed-executor-backend`` name.

    Args:
        name: The flag's value that selects it.
        executor: ``"pkg.mod:Class"`` (imported when selected) or the class; it must
            subclass :class:`Executor` (checked when resolved).
    """
    _registry.register(name, executor)


def available_executors() -> list[str]:
    """The registered executor names, sorted."""
    return _registry.names()


def get_executor_cls(name_or_path: str | type[Any] | None) -> type[Executor]:
    """The executor class for ``--distributed-executor-backend``.

    Args:
        name_or_path: A registered name (``"uni"``: the worker in this process;
            ``"mp"``: one worker process per device; ``"ray"``: one Ray actor per
            rank), a class path ``pkg.mod:Class``, or a class.

    Returns:
        An :class:`Executor` subclass.

    Raises:
        ValueError: Not a known name nor a well-formed class path.
        forkless.plugins.PluginImportError: The path does not import.
        TypeError: The class does not subclass :class:`Executor`.
    """
    target: str | type[Any] = name_or_path or "uni"
    if isinstance(target, str) and target in _registry:
        return _registry.resolve(target)
    if isinstance(target, str) and ":" not in target and "." not in target:
        raise ValueError(
            f"{_FLAG}={target!r} is invalid: expected one of "
            f"{', '.join(_registry.names())} or an Executor class path pkg.mod:Class"
        )
    cls: type[Executor] = resolve_class(target, Executor, _FLAG)
    return cls
