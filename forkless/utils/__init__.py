"""vLLM's small helpers that plugins import (``vllm.utils``): ``random_uuid`` here,
``import_utils.import_from_path``, ``collection_utils.is_list_of`` and
``torch_utils.async_tensor_h2d`` beside it."""

from __future__ import annotations

import uuid

__all__ = ["random_uuid"]


def random_uuid() -> str:
    """A new random id: 32 hexadecimal digits."""
    return uuid.uuid4().hex
