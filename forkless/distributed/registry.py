"""The device-communicator registry: a platform's ``get_device_communicator_cls()`` -> class.

A platform answers with a registered name (``"gloo"``, ``"nccl"``) or a class path
(``"pkg.mod:Class"``); a plugin may also register a name with
:func:`register_device_communicator` from a general plugin.

Invariant: nothing here imports torch; a class is imported when resolved, in the worker
that builds it.
"""

from __future__ import annotations

from typing import Any

from forkless.plugins import LazyRegistry, RegistryError, resolve_class

_WHAT = "device communicator (Platform.get_device_communicator_cls())"

_registry: LazyRegistry[type] = LazyRegistry(
    "device communicator",
    hint="A platform names its class path in get_device_communicator_cls(), or a general plugin "
    "registers a name with forkless.distributed.register_device_communicator(name, 'pkg.mod:Class').",
)
_registry.register("gloo", "forkless.distributed.gloo:GlooCommunicator")
_registry.register("nccl", "forkless.distributed.nccl:NcclCommunicator")


def register_device_communicator(name: str, communicator: Any) -> None:
    """Register a communicator under ``name``.

    Args:
        name: What a platform's ``get_device_communicator_cls()`` may return.
        communicator: ``"pkg.mod:Class"`` (imported when resolved) or the class; it must
            subclass :class:`forkless.distributed.DeviceCommunicatorBase`.
    """
    _registry.register(name, communicator)


def available_device_communicators() -> list[str]:
    """The registered names, sorted."""
    return _registry.names()


def resolve_device_communicator(name_or_path: str | type, dist_backend: str = "") -> type:
    """The communicator class for a platform's answer.

    Args:
        name_or_path: A registered name, a class path or a class; an empty value means
            the built-in for ``dist_backend``.
        dist_backend: The platform's ``torch.distributed`` backend, the fallback's name.

    Returns:
        A :class:`forkless.distributed.DeviceCommunicatorBase` subclass.

    Raises:
        ValueError: Neither a registered name nor a class path (the message lists the
            registered names).
        forkless.plugins.PluginImportError: The path does not import.
        TypeError: The class does not subclass ``DeviceCommunicatorBase``.
    """
    from forkless.distributed.interface import DeviceCommunicatorBase

    target: Any = name_or_path or dist_backend
    if not target:
        raise ValueError(f"the platform names no {_WHAT} and no dist_backend; registered: "
                         f"{', '.join(available_device_communicators())}")
    if isinstance(target, str) and target in _registry:
        cls = _registry.resolve(target)
    elif isinstance(target, str) and ":" not in target and "." not in target:
        raise ValueError(f"{_WHAT} {target!r} is not registered; registered: "
                         f"{', '.join(available_device_communicators())}, or a class path pkg.mod:Class")
    else:
        cls = resolve_class(target, DeviceCommunicatorBase, _WHAT)
    if not (isinstance(cls, type) and issubclass(cls, DeviceCommunicatorBase)):
        raise TypeError(f"{_WHAT} {target!r} is {cls!r}, not a subclass of "
                        "forkless.distributed.DeviceCommunicatorBase")
    return cls


__all__ = ["RegistryError", "available_device_communicators", "register_device_communicator",
           "resolve_device_communicator"]
