"""LoRA adapters: the request type, resolver plugins, and (in workers) batched execution.

Invariants:
    * Importing this package imports no torch: the API server uses :class:`LoRARequest`
      and the resolver registry; the torch layers (:mod:`forkless.lora.layers`) are
      imported by the model runner only.
    * Adapters are PEFT folders, read and checked by :mod:`forkless.lora.peft`.

Public names:
    LoRARequest: the adapter a request names (``LLM.generate(..., lora_request=...)``).
    LoRAResolver: base class of resolver plugins (public tier).
    LoRAResolverRegistry: where general plugins register resolvers.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forkless.lora.interface import LoRAResolver
    from forkless.lora.registry import LoRAResolverRegistry
    from forkless.protocol.lora import LoRARequest

# Imported on first use: forkless's own general plugin (forkless.lora.filesystem_resolver)
# loads in every process, and this package's names brought msgspec (~8 ms) with them.
_LAZY = {
    "LoRARequest": "forkless.protocol.lora",
    "LoRAResolver": "forkless.lora.interface",
    "LoRAResolverRegistry": "forkless.lora.registry",
}

__all__ = ["LoRARequest", "LoRAResolver", "LoRAResolverRegistry"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # the next access is a plain attribute
        return value
    raise AttributeError(f"module 'forkless.lora' has no attribute {name!r}")
