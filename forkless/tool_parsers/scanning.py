"""A base for tool parsers that re-scan the whole text at each step.

A subclass writes one function, :meth:`ScanningToolParser.scan`, that reads a text
(possibly cut anywhere) into content and calls. Whole-output extraction scans once;
streaming scans the previous and the current text and sends the difference. Because a
scan of a prefix only ever reports prefixes of what the full text will give, the streamed
pieces add up to exactly the whole-output result.
"""

from __future__ import annotations

import json
import random
import string
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from forkless.protocol.openai import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from forkless.tool_parsers.interface import ToolParser
from forkless.tool_parsers.json_scan import ScannedObject

if TYPE_CHECKING:
    from forkless.protocol.openai import ChatCompletionRequest


@dataclass
class PartialCall:
    """One tool call as far as the text goes.

    Attributes:
        name: The function name, once its string is complete.
        arguments: The arguments JSON seen so far (a prefix of the final one).
        complete: The call's object is closed.
    """

    name: str | None = None
    arguments: str = ""
    complete: bool = False


@dataclass
class ScanResult:
    """What :meth:`ScanningToolParser.scan` read.

    Attributes:
        content: Text outside the calls (in partial mode, without a held-back tail that
            may still become a tag).
        calls: The calls, in order.
        valid: False when the text cannot be the parser's format; whole-output
            extraction then returns the text unchanged as content.
    """

    content: str = ""
    calls: list[PartialCall] = field(default_factory=list)
    valid: bool = True


def held_tag_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def call_from_object(text: str, obj: ScannedObject, arg_keys: Sequence[str] = ("arguments", "parameters"),
                     require_args: bool = False) -> PartialCall:
    """Read ``name`` and the arguments (the first of ``arg_keys`` present) from a scan.

    Args:
        text: The text scanned.
        obj: The scan of one object in it.
        arg_keys: The keys that may hold the arguments, in order of preference.
        require_args: A call needs one of ``arg_keys``: until one appears the name is not
            reported (it may not be a call), and a finished object without one has no
            name (so it is not a call). Otherwise missing arguments are ``{}``.
    """
    call = PartialCall(complete=obj.end is not None)
    key = next((k for k in arg_keys if k in obj.fields), None)
    if "name" in obj.fields and (key is not None or not require_args):
        start, end = obj.fields["name"]
        if end is not None:
            name = json.loads(text[start:end])
            call.name = name if isinstance(name, str) and name else None
    if key is None:
        call.arguments = "{}" if call.complete and not require_args else ""
        return call
    start, end = obj.fields[key]
    if end is None:
        # A string-encoded arguments value is only sent once it can be decoded.
        call.arguments = "" if text[start] == '"' else text[start:]
    else:
        raw = text[start:end]
        call.arguments = _string_arguments(raw) if raw.startswith('"') else raw
    return call


def _string_arguments(raw: str) -> str:
    """The arguments of a call that wrote them as a JSON string (``raw``, quotes included).

    Models often encode the arguments object as a string; it is decoded so the call's
    arguments are that object. A string that holds no JSON stays the JSON string it is
    (vLLM's arguments for it), since arguments must parse as JSON, streamed or not.
    """
    decoded = json.loads(raw)
    try:
        json.loads(decoded)
    except ValueError:
        return raw
    return decoded


def make_tool_call_id(id_type: str = "random", func_name: str | None = None, idx: int | None = None) -> str:
    """A tool call id, as vLLM's ``make_tool_call_id`` makes them.

    Args:
        id_type: ``"random"``: ``chatcmpl-tool-`` and 32 random characters (OpenAI's
            shape); ``"kimi_k2"``: ``functions.<func_name>:<idx>``.
        func_name: The function's name (``kimi_k2`` ids).
        idx: The call's index (``kimi_k2`` ids).
    """
    if id_type == "kimi_k2":
        return f"functions.{func_name}:{idx}"
    return "chatcmpl-tool-" + "".join(random.choices(string.ascii_lowercase + string.digits, k=32))


class ScanningToolParser(ToolParser):
    """Implements whole and streaming extraction on top of :meth:`scan`."""

    @abstractmethod
    def scan(self, text: str, final: bool) -> ScanResult:
        """Read ``text`` into content and calls.

        Args:
            text: The model's text so far.
            final: The text is complete (hold nothing back; unfinished calls are invalid).
        """

    def extract_tool_calls(self, model_output: str,
                           request: "ChatCompletionRequest") -> ExtractedToolCallInformation:
        result = self.scan(model_output, final=True)
        calls = result.calls
        if not result.valid or not calls or not all(c.complete and c.name for c in calls):
            return ExtractedToolCallInformation(tools_called=False, content=model_output)
        for c in calls:
            try:
                json.loads(c.arguments)
            except ValueError:
                return ExtractedToolCallInformation(tools_called=False, content=model_output)
        return ExtractedToolCallInformation(
            tools_called=True,
            tool_calls=[ToolCall(id=make_tool_call_id(), function=FunctionCall(name=c.name or "", arguments=c.arguments))
                        for c in calls],
            content=result.content or None,
        )

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: "ChatCompletionRequest",
    ) -> DeltaMessage | None:
        before = self.scan(previous_text, final=False)
        now = self.scan(current_text, final=False)
        content = now.content[len(before.content):] if now.content.startswith(before.content) else ""
        deltas: list[DeltaToolCall] = []
        for i, call in enumerate(now.calls):
            if call.name is None:
                continue  # arguments wait until the name is known, so the first delta has it
            old = before.calls[i] if i < len(before.calls) else None
            if old is None or old.name is None:
                deltas.append(DeltaToolCall(index=i, id=make_tool_call_id(), type="function",
                                            function=DeltaFunctionCall(name=call.name, arguments=call.arguments)))
            elif len(call.arguments) > len(old.arguments):
                deltas.append(DeltaToolCall(index=i, function=DeltaFunctionCall(
                    arguments=call.arguments[len(old.arguments):])))
        self._record_state(now.calls, deltas)
        if not content and not deltas:
            return None
        return DeltaMessage(content=content or None, tool_calls=deltas or None)

    def _record_state(self, calls: list[PartialCall], deltas: list[DeltaToolCall]) -> None:
        """Keep the base class's vLLM-style streaming state up to date (for subclasses and
        for code that inspects a parser the way vLLM's server does)."""
        named = [c for c in calls if c.name is not None]
        self.prev_tool_call_arr = [{"name": c.name, "arguments": c.arguments} for c in named]
        self.current_tool_id = len(named) - 1
        self.current_tool_name_sent = bool(named)
        for d in deltas:
            while len(self.streamed_args_for_tool) <= d.index:
                self.streamed_args_for_tool.append("")
            if d.function is not None and d.function.arguments:
                self.streamed_args_for_tool[d.index] += d.function.arguments
