"""``hermes``: calls written as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

The format of Hermes 2 Pro, Qwen 2.5/3 and many others. The text before the first block
is content (as vLLM's parser has it: what a model writes between or after its calls is
not an answer); any number of blocks may follow one another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forkless.tool_parsers.json_scan import scan_object
from forkless.tool_parsers.scanning import ScanningToolParser, ScanResult, call_from_object, held_tag_prefix

if TYPE_CHECKING:
    from forkless.protocol.openai import ChatCompletionRequest

START, END = "<tool_call>", "</tool_call>"


class Hermes2ProToolParser(ScanningToolParser):
    """The ``hermes`` tool parser."""

    def adjust_request(self, request: "ChatCompletionRequest") -> "ChatCompletionRequest":
        # Where <tool_call> is a special token, skipping special tokens would erase the
        # very markers this parser looks for.
        if request.tools and request.tool_choice != "none" and self._tag_is_special():
            request.skip_special_tokens = False
        return request

    def _tag_is_special(self) -> bool:
        added: Any = getattr(self.model_tokenizer, "get_added_vocab", lambda: {})()
        return START in added

    def scan(self, text: str, final: bool) -> ScanResult:
        result = ScanResult()
        pos = 0
        while True:
            k = text.find(START, pos)
            if k < 0:
                if not result.calls:
                    tail = text[pos:]
                    result.content += tail if final else tail[: len(tail) - held_tag_prefix(tail, START)]
                return result
            if not result.calls:
                result.content += text[pos:k]
            obj = scan_object(text, k + len(START))
            if obj.error:
                result.valid = False
                return result
            result.calls.append(call_from_object(text, obj))
            if obj.end is None:
                result.valid = not final
                return result
            close = text.find(END, obj.end)
            if close < 0:
                # The closing tag is still to come, or the model stopped right after the
                # object, which still is a complete call.
                return result
            pos = close + len(END)
