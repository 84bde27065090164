"""The attention-backend registry: ``--attention-backend NAME`` -> backend class path."""

from __future__ import annotations

from typing import Any

from forkless.attention.interface import AttentionBackend
from forkless.plugins import LazyRegistry, RegistryError

_BUILTIN_BACKENDS = {
    "torch": "forkless.attention.backends.torch_sdpa:TorchAttentionBackend",
    # The torch reference with a compiled C decode kernel: the cpu platform's default.
    "cpu": "forkless.attention.backends.cpu_paged:CpuAttentionBackend",
    # Imports triton: select it only where triton and a GPU are present.
    "triton": "forkless.attention.backends.triton_paged:TritonAttentionBackend",
}

_registry: LazyRegistry[type[AttentionBackend]] = LazyRegistry(
    "attention backend",
    base=AttentionBackend,
    hint="Register one with forkless.attention.register_attention_backend(name, "
    "'pkg.mod:Class') from a forkless.general_plugins entry point.",
)
for _name, _path in _BUILTIN_BACKENDS.items():
    _registry.register(_name, _path)


def register_attention_backend(name: str, backend: Any) -> None:
    """Register an attention backend under ``name``.

    Args:
        name: The value users pass to ``--attention-backend``.
        backend: ``"pkg.mod:Class"`` (imported lazily, only in workers) or the class; it
            must subclass :class:`AttentionBackend` (checked when first resolved).
    """
    _registry.register(name, backend)


def get_attention_backend(name: str) -> type[AttentionBackend]:
    """Import and return the backend class registered under ``name``.

    Args:
        name: A registered backend name.

    Returns:
        The :class:`AttentionBackend` subclass.

    Raises:
        forkless.plugins.RegistryError: Unknown name; the message lists the registered
            names.
        forkless.plugins.PluginImportError: The registered path does not import.
        TypeError: The registered object is not an :class:`AttentionBackend` subclass.
    """
    return _registry.resolve(name)


def attention_backend_path(name: str) -> str:
    """The class path registered under ``name`` (what a platform returns).

    Raises:
        forkless.plugins.RegistryError: Unknown name; the message lists the registered
            names.
    """
    if name not in _registry:
        raise RegistryError(_registry.unknown_message(name))
    path = _registry.get_path(name)
    if path is None:  # registered as an object
        cls = _registry.resolve(name)
        path = f"{cls.__module__}:{cls.__qualname__}"
    return path


def describe_attention_backend(name: str) -> str:
    """``name`` and its class path for messages, with the plugin that registered it, if
    one did (a plugin may replace a built-in's path)."""
    return _registry.describe(name)


def available_attention_backends() -> list[str]:
    """The registered backend names, sorted."""
    return _registry.names()
