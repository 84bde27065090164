"""vLLM's module path for the reasoning parser base and manager (``vllm.reasoning.abs_reasoning_parsers``)."""

from forkless.reasoning.interface import ReasoningParser
from forkless.reasoning.registry import ReasoningParserManager

__all__ = ["ReasoningParser", "ReasoningParserManager"]
