"""vLLM's ``vllm.entrypoints.chat_utils`` path, for what tool parsers import from it."""

from forkless.tool_parsers.scanning import make_tool_call_id

__all__ = ["make_tool_call_id"]
