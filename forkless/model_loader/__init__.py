"""Turning a model folder into a ready model on a device.

The API server imports this package (for the GGUF default-model cache), so nothing here
imports torch eagerly: the public functions are resolved on first access.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forkless.model_loader.dtype import resolve_dtype
    from forkless.model_loader.loader import load_model
    from forkless.model_loader.weights import iterate_weights

_LAZY = {
    "load_model": "forkless.model_loader.loader",
    "resolve_dtype": "forkless.model_loader.dtype",
    "iterate_weights": "forkless.model_loader.weights",
}

__all__ = ["iterate_weights", "load_model", "resolve_dtype"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'forkless.model_loader' has no attribute {name!r}")
