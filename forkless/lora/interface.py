"""The LoRA resolver interface: finds an adapter the server does not know yet, by name.

Invariants:
    * Resolvers run in the API server only, and only when runtime LoRA updating is on
      (``FORKLESS_ALLOW_RUNTIME_LORA_UPDATING=1``): a request whose ``model`` is neither the
      served model nor a loaded adapter asks each registered resolver in registration
      order; the first :class:`LoRARequest` returned that passes the server's check is
      loaded and served (one that does not leaves the name to the next resolver).
    * A resolver only *finds* an adapter (a local folder); the server checks and loads it
      like any other, so a bad folder is the request's 400, not a crash.
"""

from __future__ import annotations

import abc

from forkless.plugins import Stability, stability
from forkless.protocol.lora import LoRARequest


@stability(Stability.PUBLIC)
class LoRAResolver(abc.ABC):
    """Finds LoRA adapters by name (vLLM's ``LoRAResolver``).

    Register an instance with ``LoRAResolverRegistry.register_resolver(name, resolver)``
    from a ``forkless.general_plugins`` entry point.
    """

    @abc.abstractmethod
    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        """The adapter called ``lora_name`` for ``base_model_name``, or ``None``.

        Args:
            base_model_name: The base model as the server was given it (``--model``: a
                path or a hub name; not ``--served-model-name``), as vLLM passes it.
            lora_name: The name the request gave as its ``model``.

        Returns:
            A :class:`LoRARequest` whose ``lora_path`` is a local PEFT adapter folder
            (its ``lora_int_id`` is replaced by the server's own), or ``None`` when this
            resolver does not know the name.
        """
