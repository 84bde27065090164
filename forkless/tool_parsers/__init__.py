"""Tool parsers: model text -> OpenAI ``tool_calls`` (public extension point).

Built-ins: ``hermes`` and ``llama3_json``. Select one with ``--tool-call-parser NAME``
and ``--enable-auto-tool-choice``; add one with ``ToolParserManager.register_module``.
The response types a parser returns are re-exported here for plugin authors, imported
on first access so that registering a parser from a general plugin stays cheap.
"""

from typing import TYPE_CHECKING, Any

from forkless.tool_parsers.interface import ToolParser
from forkless.tool_parsers.registry import ToolParserManager

if TYPE_CHECKING:
    from forkless.protocol.openai import (
        DeltaFunctionCall,
        DeltaMessage,
        DeltaToolCall,
        ExtractedToolCallInformation,
        FunctionCall,
        ToolCall,
    )

_PROTOCOL = {"DeltaFunctionCall", "DeltaMessage", "DeltaToolCall", "ExtractedToolCallInformation",
             "FunctionCall", "ToolCall"}

__all__ = [
    "DeltaFunctionCall",
    "DeltaMessage",
    "DeltaToolCall",
    "ExtractedToolCallInformation",
    "FunctionCall",
    "ToolCall",
    "ToolParser",
    "ToolParserManager",
]


def __getattr__(name: str) -> Any:
    if name in _PROTOCOL:
        from forkless.protocol import openai as protocol

        return getattr(protocol, name)
    raise AttributeError(f"module 'forkless.tool_parsers' has no attribute {name!r}")
