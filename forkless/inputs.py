"""Prompt types of the offline API, under vLLM's names (``from forkless.inputs import
TokensPrompt``): plain dicts, typed for checkers.

Invariants: these are ``TypedDict`` s, so a prompt built with them is the same dict
``LLM.generate`` takes without them; forkless's models read text only, so the multimodal
keys of vLLM's prompts (``multi_modal_data``, ``mm_processor_kwargs``) are refused
(``Processor``), not declared here.
"""

from __future__ import annotations

from typing import NotRequired, Sequence, TypedDict, Union


class TextPrompt(TypedDict):
    """A prompt as text, tokenized by the engine."""

    prompt: str
    # Isolates this prompt's prefix-cache entries from other users' (vLLM's cache_salt).
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    """A prompt as token ids (``prompt``, if given, is only reported back)."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    # A cross-encoder pair's segment ids (pooling only).
    token_type_ids: NotRequired[list[int]]
    cache_salt: NotRequired[str]


# One prompt: text, token ids, or one of the dicts above.
SingletonPrompt = Union[str, Sequence[int], TextPrompt, TokensPrompt]
PromptType = SingletonPrompt

__all__ = ["TextPrompt", "TokensPrompt", "SingletonPrompt", "PromptType"]
