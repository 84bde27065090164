"""vLLM's ``vllm.tokenizers`` path, for the type that parsers ported from vLLM annotate with.

forkless serves Hugging Face tokenizers; ``TokenizerLike`` describes what parsers use of one.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class TokenizerLike(Protocol):
    """What a parser may use of the served model's tokenizer."""

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]: ...

    def decode(self, ids: Any, *args: Any, **kwargs: Any) -> str: ...

    def get_vocab(self) -> dict[str, int]: ...


#: vLLM's older name (``vllm.transformers_utils.tokenizer.AnyTokenizer``).
AnyTokenizer = TokenizerLike

__all__ = ["AnyTokenizer", "TokenizerLike"]
