"""vLLM's ``vllm.utils.collection_utils``: type checks of collections."""

from __future__ import annotations

from typing import Any, Literal


def is_list_of(value: object, typ: type | tuple[type, ...], *, check: Literal["first", "all"] = "first") -> bool:
    """Whether ``value`` is a list whose items are ``typ`` (only the first one checked with
    ``check="first"``, vLLM's default; an empty list is one)."""
    if not isinstance(value, list):
        return False
    items: Any = value[:1] if check == "first" else value
    return all(isinstance(v, typ) for v in items)
