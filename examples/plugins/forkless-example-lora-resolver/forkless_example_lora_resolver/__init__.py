"""Registers ``TableResolver`` with forkless's LoRA resolver registry — by path.

This function runs in every forkless process; it is re-entrant (the same path twice is a
no-op) and cheap: the resolver class is imported, and instantiated, only when the API
server first asks it for an adapter.
"""


def register() -> None:
    from forkless.lora import LoRAResolverRegistry

    LoRAResolverRegistry.register_resolver("example_lora_resolver", "forkless_example_lora_resolver.resolver:TableResolver")
