"""Reasoning parsers: split a model's reasoning from its answer (public extension point).

Built-ins: ``deepseek_r1`` and ``qwen3`` (``<think>…</think>``). Select one with
``--reasoning-parser NAME``; add one with ``ReasoningParserManager.register_module``.
The API is vLLM's (``vllm.reasoning`` -> ``forkless.reasoning``); the vLLM module paths
``abs_reasoning_parsers`` and ``basic_parsers`` exist here too.
"""

from typing import TYPE_CHECKING, Any

from forkless.reasoning.interface import ReasoningParser
from forkless.reasoning.registry import ReasoningParserManager

if TYPE_CHECKING:
    from forkless.protocol.openai import DeltaMessage

__all__ = ["DeltaMessage", "ReasoningParser", "ReasoningParserManager"]


def __getattr__(name: str) -> Any:
    # Imported on first access: registering a parser should not load pydantic.
    if name == "DeltaMessage":
        from forkless.protocol.openai import DeltaMessage

        return DeltaMessage
    raise AttributeError(f"module 'forkless.reasoning' has no attribute {name!r}")
