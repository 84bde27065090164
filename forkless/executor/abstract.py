"""The executor extension point (provisional): the engine core's handle on its workers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from forkless.plugins import Stability, resolve_class, stability

if TYPE_CHECKING:
    from forkless.config import EngineConfig
    from forkless.core.sched.output import ModelRunnerOutput, SchedulerOutput

# Built-ins by path: the multiprocess executor is only imported when chosen.
_BUILTIN_EXECUTORS = {
    "uni": "forkless.executor.uniproc:UniProcExecutor",
    "mp": "forkless.executor.multiproc:MultiprocExecutor",
}
_FLAG = "--distributed-executor-backend"


@stability(Stability.PROVISIONAL)
class Executor(ABC):
    """Runs the model on one or more workers on behalf of the engine core.

    The engine core calls, in order: ``determine_num_blocks()``,
    ``initialize_cache(num_blocks)``, then ``execute_model(...)`` once per step, and
    ``shutdown()`` at the end.

    Args:
        config: The engine configuration; workers are created and their models loaded
            in the constructor.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @abstractmethod
    def determine_num_blocks(self) -> int:
        """How many KV-cache blocks every worker can hold (the minimum over workers)."""

    @abstractmethod
    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` KV-cache blocks on every worker."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step and return the sampled tokens (from the driver worker)."""

    @property
    def supports_async_scheduling(self) -> bool:
        """Whether :meth:`execute_model_async` launches without waiting (default: no)."""
        return False

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> Any:
        """Launch one step; :meth:`collect` returns its output. The default runs it now."""
        return self.execute_model(scheduler_output)

    def collect(self, pending: Any) -> ModelRunnerOutput:
        """The output of a step launched by :meth:`execute_model_async`."""
        return pending

    @abstractmethod
    def check_health(self) -> None:
        """Raise if a worker is dead or unhealthy."""

    def shutdown(self) -> None:
        """Release the workers (idempotent)."""


def get_executor_cls(name_or_path: str | type[Any] | None) -> type[Executor]:
    """The executor class for ``--distributed-executor-backend``.

    Args:
        name_or_path: ``"uni"`` (the worker in this process), ``"mp"`` (one worker
            process per device), a class path ``pkg.mod:Class``, or a class.

    Returns:
        An :class:`Executor` subclass.

    Raises:
        ValueError: Not a known name nor a well-formed class path.
        forkless.plugins.PluginImportError: The path does not import.
        TypeError: The class does not subclass :class:`Executor`.
    """
    target: str | type[Any] = name_or_path or "uni"
    if isinstance(target, str):
        builtin = _BUILTIN_EXECUTORS.get(target)
        if builtin is None and ":" not in target and "." not in target:
            raise ValueError(
                f"{_FLAG}={target!r} is invalid: expected one of "
                f"{', '.join(_BUILTIN_EXECUTORS)} or an Executor class path pkg.mod:Class"
            )
        target = builtin or target
    cls: type[Executor] = resolve_class(target, Executor, _FLAG)
    return cls
