"""A tool parser for calls written as ``<function=NAME>{JSON arguments}</function>``."""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from forkless.tool_parsers import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
    ToolParser,
)

START = "<function="
CALL = re.compile(r"<function=([\w.-]+)>(.*?)</function>", re.S)


def _calls(text: str) -> list[tuple[str, str]]:
    calls = []
    for match in CALL.finditer(text):
        try:
            json.loads(match[2])
        except ValueError:
            continue  # not a call: leave the text as content
        calls.append((match[1], match[2].strip()))
    return calls


def _visible(text: str) -> str:
    """The text that is settled: up to an unclosed call, or a tail that may start one."""
    last = 0
    for match in CALL.finditer(text):
        last = match.end()
    cut = text.find(START, last)
    if cut >= 0:
        return text[:cut]
    for n in range(min(len(START) - 1, len(text)), 0, -1):
        if text.endswith(START[:n]):
            return text[:-n]
    return text


class FunctionTagToolParser(ToolParser):
    """Sends each call whole once its closing tag arrives, and the text around calls as content."""

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        calls = _calls(model_output)
        if not calls:
            return ExtractedToolCallInformation(tools_called=False, content=model_output)
        return ExtractedToolCallInformation(
            tools_called=True,
            tool_calls=[ToolCall(function=FunctionCall(name=n, arguments=a)) for n, a in calls],
            content=CALL.sub("", model_output) or None,
        )

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                     previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
                                     delta_token_ids: Sequence[int], request: Any) -> DeltaMessage | None:
        before, now = _calls(previous_text), _calls(current_text)
        new_calls = [
            DeltaToolCall(index=i, id=ToolCall(function=FunctionCall(name=n, arguments=a)).id, type="function",
                          function=DeltaFunctionCall(name=n, arguments=a))
            for i, (n, a) in enumerate(now) if i >= len(before)
        ]
        old_content = CALL.sub("", _visible(previous_text))
        content = CALL.sub("", _visible(current_text))[len(old_content):]
        if not new_calls and not content:
            return None
        return DeltaMessage(content=content or None, tool_calls=new_calls or None)
