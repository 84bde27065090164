"""Constrained decoding in the OpenAI API: ``response_format``, vLLM's
``structured_outputs`` field, and ``tool_choice`` ``"required"`` or a named function.

A forced tool choice is a JSON-schema constraint, as in vLLM: a named function's output
is its arguments object (valid against the tool's ``parameters``); ``"required"``'s is a
JSON array of ``{"name", "parameters"}`` objects, one per call, each naming a listed tool
and valid against its schema. The model's output then always parses into the calls
(:class:`ForcedToolCalls`), whatever tool parser the server runs.

Invariants:
    * Every bad value is a ``BadRequest`` naming the field; the schema itself is checked
      by the processor (``forkless.structured_output``), before the engine core.
    * At most one constraint per request: two (``response_format`` and
      ``structured_outputs``, or either with a forced tool choice) is a 400.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from forkless.entrypoints.openai.errors import BadRequest
from forkless.entrypoints.openai.tool_call_array import ToolCallArrayScanner
from forkless.protocol.openai import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    NamedToolChoice,
    ToolCall,
    random_id,
)
from forkless.sampling_params import StructuredOutputsParams
from forkless.tool_parsers.utils import get_json_schema_from_tools

if TYPE_CHECKING:
    from forkless.protocol.openai import ChatCompletionRequest, SamplingFields

def _params(fields: dict[str, Any], param: str) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**fields)
    except TypeError as exc:
        known = "json, regex, choice, grammar, json_object, disable_fallback, disable_any_whitespace, " \
                "disable_additional_properties"
        raise BadRequest(f"{param}: {exc} (known fields: {known})", param) from None
    except ValueError as exc:
        raise BadRequest(f"{param}: {exc}", param) from None


def request_constraint(req: SamplingFields) -> StructuredOutputsParams | None:
    """The constraint of ``response_format`` or ``structured_outputs`` (``None``: none).

    Raises:
        BadRequest: Both are given, or one is malformed.
    """
    found: list[tuple[str, StructuredOutputsParams]] = []
    if req.structured_outputs is not None:
        fields = {k: v for k, v in req.structured_outputs.items() if not k.startswith("_")}
        found.append(("structured_outputs", _params(fields, "structured_outputs")))
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object":
            found.append(("response_format", StructuredOutputsParams(json_object=True)))
        else:
            if fmt.json_schema is None:
                raise BadRequest('response_format of type "json_schema" needs a "json_schema" object '
                                 '({"name": ..., "schema": {...}})', "response_format")
            schema = fmt.json_schema.json_schema
            found.append(("response_format", _params({"json": schema if schema is not None else {"type": "object"}},
                                                     "response_format")))
    if len(found) > 1:
        raise BadRequest("give one of response_format and structured_outputs, not both", "structured_outputs")
    return found[0][1] if found else None


def forced_tool_choice(req: ChatCompletionRequest) -> str | None:
    """``"required"``, the named function, or ``None`` when the tool choice is free.

    Raises:
        BadRequest: A ``tool_choice`` other than ``"none"`` without ``tools``, or one
            naming a function not in ``tools``.
    """
    choice = req.tool_choice
    if req.tools is not None and not req.tools:
        # vLLM's and OpenAI's 400: an empty list offers nothing to choose from.
        raise BadRequest("tools is an empty array: give at least one tool, or leave tools out", "tools")
    if choice == "auto" and req.tools is None:
        # vLLM's and OpenAI's 400: "auto" chooses among tools, and there are none.
        raise BadRequest('tool_choice="auto" needs tools (leave tool_choice out, or give "none", for a '
                         "reply without tools)", "tool_choice")
    if choice == "required":
        if not req.tools:
            raise BadRequest('tool_choice="required" needs tools', "tool_choice")
        return "required"
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        names = [t.function.name for t in req.tools or []]
        if name not in names:
            raise BadRequest(f"tool_choice names function {name!r}, which is not in tools "
                             f"({', '.join(map(repr, names)) or 'none given'})", "tool_choice")
        return name
    return None


def tool_constraint(req: ChatCompletionRequest, forced: str) -> StructuredOutputsParams:
    """The JSON schema a forced tool choice constrains the output to (see the module).

    Raises:
        BadRequest: The tools' schemas cannot be combined (one ``$defs`` name, two schemas).
    """
    try:
        schema = get_json_schema_from_tools(req.tool_choice, req.tools or [],
                                            parallel_tool_calls=req.parallel_tool_calls is not False)
    except ValueError as e:
        raise BadRequest(str(e), "tools") from None
    assert schema is not None  # forced: "required" or a function in tools
    return _params({"json": schema}, "tools")


class ForcedToolCalls:
    """The tool-call "parser" of a forced tool choice: the output is the calls' JSON.

    Used where a :class:`~forkless.tool_parsers.ToolParser` is (``ChoiceParser.tools``).
    A stream sends each call as it is written, as vLLM and OpenAI do: a first delta with
    its index, id, type and name, then its arguments in pieces (``index`` and
    ``function.arguments`` only). A named function's arguments are the whole output;
    ``"required"``'s are the text of each array element's ``parameters``, as the model
    wrote it, streamed or not (:mod:`~forkless.entrypoints.openai.tool_call_array`), so
    the pieces add up to the unstreamed call.

    Args:
        forced: ``"required"`` or the function's name.
    """

    def __init__(self, forced: str) -> None:
        self.forced = forced
        self._call_id = random_id("chatcmpl-tool")
        self._scanner = ToolCallArrayScanner()
        self._sent: list[int] = []  # per streamed call, how much of its arguments went out

    def adjust_request(self, request: ChatCompletionRequest) -> ChatCompletionRequest:
        return request

    def extract_tool_calls(self, model_output: str, request: ChatCompletionRequest) -> ExtractedToolCallInformation:
        if self.forced != "required":
            call = ToolCall(id=self._call_id, function=FunctionCall(name=self.forced, arguments=model_output))
            return ExtractedToolCallInformation(tools_called=True, tool_calls=[call], content=None)
        try:
            items, cut = json.loads(model_output), False
        except json.JSONDecodeError:
            # Cut by max_tokens: the calls as far as they are written, each with its name,
            # the last one's arguments unfinished -- what a stream of the same output sent
            # (as a named function's cut arguments are returned); none before a whole name.
            items, cut = None, True
        calls = [ToolCall(id=random_id("chatcmpl-tool"),
                          function=FunctionCall(name=call.name, arguments=call.arguments(model_output)))
                 for call in ToolCallArrayScanner().feed(model_output)
                 if call.name is not None and (cut or call.arguments_end is not None)]
        if cut:
            return ExtractedToolCallInformation(tools_called=bool(calls), tool_calls=calls, content=None)
        if not isinstance(items, list) or len(calls) != len(items):
            # Not the constraint's shape (a backend that could not hold the output to it).
            return ExtractedToolCallInformation(tools_called=False, content=model_output)
        return ExtractedToolCallInformation(tools_called=bool(calls), tool_calls=calls,
                                            content=None if calls else model_output)

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                     previous_token_ids: Any, current_token_ids: Any, delta_token_ids: Any,
                                     request: ChatCompletionRequest) -> DeltaMessage | None:
        if not delta_text:
            return None
        if self.forced != "required":
            if not previous_text:
                call = DeltaToolCall(index=0, id=self._call_id, type="function",
                                     function=DeltaFunctionCall(name=self.forced, arguments=delta_text))
            else:
                call = DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=delta_text))
            return DeltaMessage(tool_calls=[call])
        deltas = []
        for index, scanned in enumerate(self._scanner.feed(current_text)):
            if scanned.name is None:
                continue  # a call goes out with its name, which must be whole
            arguments = scanned.arguments(current_text)
            if index == len(self._sent):
                deltas.append(DeltaToolCall(index=index, id=random_id("chatcmpl-tool"), type="function",
                                            function=DeltaFunctionCall(name=scanned.name, arguments=arguments)))
                self._sent.append(len(arguments))
            elif index < len(self._sent) and len(arguments) > self._sent[index]:
                deltas.append(DeltaToolCall(index=index,
                                            function=DeltaFunctionCall(arguments=arguments[self._sent[index]:])))
                self._sent[index] = len(arguments)
        return DeltaMessage(tool_calls=deltas) if deltas else None
