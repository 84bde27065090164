"""vLLM's module path for the tool parser base and manager (``vllm.tool_parsers.abstract_tool_parser``)."""

from forkless.tool_parsers.interface import ToolParser
from forkless.tool_parsers.registry import ToolParserManager
from forkless.tool_parsers.utils import Tool

__all__ = ["Tool", "ToolParser", "ToolParserManager"]
