"""LoRA adapters: the request type and (in workers) batched execution.

Invariants:
    * Importing this package imports no torch: the API server uses
      :class:`LoRARequest`; the torch layers (:mod:`forkless.lora.layers`) are imported by
      the model runner only.
    * Adapters are PEFT folders, read and checked by :mod:`forkless.lora.peft`.

Public names:
    LoRARequest: the adapter a request names (``LLM.generate(..., lora_request=...)``).
"""

from forkless.protocol.lora import LoRARequest

__all__ = ["LoRARequest"]
