"""A LoRA resolver that looks names up in a JSON table ``{"name": "/adapter/folder", ...}``.

The table is the file named by ``FORKLESS_EXAMPLE_LORA_TABLE``, read on every lookup, so
adapters can be added while the server runs. A name that is not in the table is left to
the next resolver (``None``).
"""

from __future__ import annotations

import asyncio
import json
import os

from forkless.lora import LoRARequest, LoRAResolver


class TableResolver(LoRAResolver):
    """Serves the adapters listed in ``$FORKLESS_EXAMPLE_LORA_TABLE``."""

    def _lookup(self, lora_name: str) -> str | None:
        table_path = os.environ.get("FORKLESS_EXAMPLE_LORA_TABLE")
        if not table_path:
            return None
        try:
            with open(table_path, encoding="utf-8") as f:
                table = json.load(f)
        except (OSError, ValueError):
            return None
        path = table.get(lora_name) if isinstance(table, dict) else None
        return path if isinstance(path, str) else None

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        # File reads off the event loop: the API server serves other requests meanwhile.
        path = await asyncio.to_thread(self._lookup, lora_name)
        if path is None:
            return None
        return LoRARequest(lora_name, 1, path, base_model_name)  # the server assigns the id
