"""The built-in filesystem LoRA resolver: ``FORKLESS_LORA_RESOLVER_CACHE_DIR/<name>/``.

Invariants:
    * Registered by :func:`register_filesystem_resolver`, a general plugin of forkless's
      own distribution (entry point ``lora_filesystem_resolver`` in
      ``forkless.general_plugins``), exactly as a third-party resolver is: ``forkless
      plugins list`` shows it and ``FORKLESS_PLUGINS`` can leave it out.
    * It registers only when ``FORKLESS_LORA_RESOLVER_CACHE_DIR`` is set; the server asks
      resolvers only with runtime LoRA updating on.
    * Importing this module imports nothing but ``forkless.envs``: it is loaded in every
      process of every engine, and most never resolve an adapter. The resolver itself
      (``forkless.lora.filesystem.FilesystemResolver``: it answers only for a PEFT LoRA
      folder whose ``base_model_name_or_path`` is the served model's name) is imported
      when the folder is configured.
"""

from __future__ import annotations

import os

from forkless import envs

#: The name the resolver is registered under.
RESOLVER_NAME = "lora_filesystem_resolver"


def register_filesystem_resolver() -> None:
    """General-plugin entry point: register the resolver when its folder is configured.

    Raises:
        ValueError: ``FORKLESS_LORA_RESOLVER_CACHE_DIR`` is set but is not a folder.
    """
    cache_dir = envs.FORKLESS_LORA_RESOLVER_CACHE_DIR
    if cache_dir is None:
        return
    if not os.path.isdir(cache_dir):
        raise ValueError(f"FORKLESS_LORA_RESOLVER_CACHE_DIR={cache_dir!r} is not a folder")
    from forkless.lora.filesystem import FilesystemResolver
    from forkless.lora.registry import LoRAResolverRegistry

    LoRAResolverRegistry.register_resolver(RESOLVER_NAME, FilesystemResolver(cache_dir))
