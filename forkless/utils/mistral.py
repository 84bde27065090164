"""vLLM's ``vllm.utils.mistral``, for tool parsers ported from vLLM that ask about it.

forkless loads every tokenizer through Hugging Face ``tokenizers`` / ``transformers``; it
has no Mistral-native (``mistral_common``) tokenizer, so none is one.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_mistral_tokenizer"]


def is_mistral_tokenizer(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` is a ``mistral_common`` tokenizer: never, in forkless."""
    return False
