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

from forkless.lora.interface import LoRAResolver
from forkless.lora.registry import LoRAResolverRegistry
from forkless.protocol.lora import LoRARequest

__all__ = ["LoRARequest", "LoRAResolver", "LoRAResolverRegistry"]
