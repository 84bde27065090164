"""The order pooling inputs go to the engine in (torch-free: the API server uses it).

A pooling step pads its sequences' attention to the step's longest, so inputs of similar
lengths in one step waste little; sentence-transformers sorts its inputs by length before
batching for the same reason. Only the submission order changes: outputs are returned in
input order by the callers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def token_count(prompt: Any) -> int:
    """Tokens of a tokenized prompt (a dict with ``prompt_token_ids``, or a list of ids); 0
    for a prompt the engine tokenizes itself."""
    if isinstance(prompt, dict):
        token_ids = prompt.get("prompt_token_ids")
        return len(token_ids) if token_ids is not None else 0
    return len(prompt) if isinstance(prompt, list) else 0


def longest_first(prompts: Sequence[Any]) -> list[int]:
    """Indexes of ``prompts``, longest first (ties in input order)."""
    return sorted(range(len(prompts)), key=lambda i: -token_count(prompts[i]))
