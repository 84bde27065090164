"""Every environment variable forkless reads, in one place.

Values are read lazily, on each attribute access, so that a test (or a parent process that
spawns a child) can change ``os.environ`` and be seen immediately. This module imports only
the standard library: every process, the API server included, imports it first.

Usage::

    from forkless import envs
    root = envs.FORKLESS_CACHE_ROOT

To add a variable, add one entry to :data:`environment_variables`.
"""

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    FORKLESS_CACHE_ROOT: str
    FORKLESS_FUSED_KERNELS: bool
    FORKLESS_CPU_KERNELS: bool
    FORKLESS_KERNEL_CACHE_DIR: str


def _cache_root() -> str:
    # Follow the XDG base-directory convention, as huggingface_hub and pip do, so that users
    # who moved their caches off a small home partition get forkless's cache moved too.
    explicit = os.environ.get("FORKLESS_CACHE_ROOT")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return os.path.abspath(os.path.join(os.path.expanduser(xdg), "forkless"))


environment_variables: dict[str, Callable[[], Any]] = {
    # Root of every file forkless caches (converted GGUF models, ...). Default:
    # ``$XDG_CACHE_HOME/forkless``, or ``~/.cache/forkless`` when XDG_CACHE_HOME is unset.
    "FORKLESS_CACHE_ROOT": _cache_root,
    # Decoder layers run fused kernels for RMSNorm, rotary embeddings and SiLU-and-mul
    # (Triton on CUDA, the C kernels of FORKLESS_CPU_KERNELS on the CPU). ``0`` runs the
    # plain PyTorch ops instead (to compare or to debug).
    "FORKLESS_FUSED_KERNELS": lambda: os.environ.get("FORKLESS_FUSED_KERNELS", "1") != "0",
    # On CPU (float32), decode attention, the linear layers and the fused layer ops run C
    # kernels compiled once with the system C compiler (``$CC`` or ``cc``) into
    # FORKLESS_KERNEL_CACHE_DIR. ``0`` runs plain torch ops instead (to compare or to debug).
    "FORKLESS_CPU_KERNELS": lambda: os.environ.get("FORKLESS_CPU_KERNELS", "1") != "0",
    # Where compiled kernels are cached (content-addressed, so one directory can serve
    # every cache root). Default: ``$FORKLESS_CACHE_ROOT/kernels``.
    "FORKLESS_KERNEL_CACHE_DIR": lambda: os.path.abspath(os.path.expanduser(
        os.environ.get("FORKLESS_KERNEL_CACHE_DIR") or os.path.join(_cache_root(), "kernels"))),
}


def __getattr__(name: str) -> Any:
    getter = environment_variables.get(name)
    if getter is None:
        raise AttributeError(f"module 'forkless.envs' has no attribute {name!r}")
    return getter()


def __dir__() -> list[str]:
    return sorted(environment_variables)


def is_set(name: str) -> bool:
    """Whether a known forkless variable is present in the environment.

    Args:
        name: The variable's name, e.g. ``"FORKLESS_CACHE_ROOT"``.

    Returns:
        True when the variable is set, even to the empty string.

    Raises:
        KeyError: When ``name`` is not a variable forkless knows.
    """
    if name not in environment_variables:
        known = sorted(environment_variables)
        raise KeyError(f"unknown forkless environment variable {name!r}; known: {known}")
    return name in os.environ
