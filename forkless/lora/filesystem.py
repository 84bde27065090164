"""The filesystem LoRA resolver's class (``forkless.lora.filesystem_resolver`` registers it).

Invariants:
    * It answers only for a folder holding a PEFT LoRA adapter whose
      ``base_model_name_or_path`` is the ``base_model_name`` the server asks with (the
      model as ``--model`` gave it, as in vLLM); the server then checks and loads the
      adapter like any other.
    * As vLLM's: a name may be a relative path below the folder (``org/adapter``), and what
      it names, symlinks resolved, must lie inside the folder: nothing outside it is ever
      read. Names with empty, ``.`` or ``..`` components find nothing, so one adapter
      folder has one name; the adapter is served from its resolved path.
"""

from __future__ import annotations

import json
import os

from forkless.logger import init_logger
from forkless.lora.interface import LoRAResolver
from forkless.lora.peft import CONFIG_FILE
from forkless.protocol.lora import LoRARequest

logger = init_logger(__name__)


class FilesystemResolver(LoRAResolver):
    """Finds adapter ``name`` in ``<cache_dir>/<name>/``.

    Args:
        lora_cache_dir: The folder of adapter folders.
    """

    def __init__(self, lora_cache_dir: str) -> None:
        self.lora_cache_dir = lora_cache_dir

    def _path(self, lora_name: str) -> str | None:
        """The resolved folder ``lora_name`` names inside the cache folder, or ``None``."""
        parts = lora_name.replace(os.altsep, os.sep).split(os.sep) if os.altsep else lora_name.split(os.sep)
        if not lora_name or os.path.isabs(lora_name) or any(p in ("", ".", "..") for p in parts):
            return None
        try:
            root = os.path.realpath(self.lora_cache_dir)
            path = os.path.realpath(os.path.join(root, *parts))
        except (OSError, ValueError):  # too long, a NUL
            return None
        # A symlink may point anywhere: what counts is where it leads.
        return path if path != root and os.path.commonpath([root, path]) == root else None

    def _find(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        path = self._path(lora_name)
        if path is None:
            return None
        try:
            with open(os.path.join(path, CONFIG_FILE), encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(config, dict) or str(config.get("peft_type", "LORA")).upper() != "LORA":
            return None
        if config.get("base_model_name_or_path") != base_model_name:
            logger.info("LoRA adapter folder %s is for %r, not the model %r: not served", path,
                        config.get("base_model_name_or_path"), base_model_name)
            return None
        # The server replaces the id with one of its own.
        return LoRARequest(lora_name, 1, path, base_model_name)

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        import asyncio  # here: the plugin registers in every process, most never resolve

        return await asyncio.to_thread(self._find, base_model_name, lora_name)
