"""The message fields parsers fill: ``reasoning`` and its deprecated alias, tool calls, and
the vLLM module paths that parsers import them from."""

from __future__ import annotations

import importlib
import json

import pytest

from forkless.protocol import openai as protocol
from forkless.protocol.openai import (
    ChatCompletionChunk,
    ChatMessage,
    ChatResponseMessage,
    ChatStreamChoice,
    DeltaMessage,
    FunctionCall,
    ToolCall,
)


@pytest.mark.parametrize("cls", [DeltaMessage, ChatResponseMessage])
def test_reasoning_is_sent_under_both_names(cls) -> None:
    message = cls(reasoning="steps", content="answer")
    assert message.reasoning == "steps"
    data = json.loads(message.model_dump_json())
    assert data["reasoning"] == data["reasoning_content"] == "steps" and data["content"] == "answer"
    assert list(data).index("reasoning_content") == list(data).index("reasoning") + 1
    assert message.model_dump(exclude_none=True)["reasoning_content"] == "steps"
    empty = cls(content="answer")
    assert (empty.model_dump()["reasoning"], empty.model_dump()["reasoning_content"]) == (None, None)
    assert "reasoning_content" not in empty.model_dump(exclude_none=True)


@pytest.mark.parametrize("cls", [DeltaMessage, ChatResponseMessage])
def test_the_old_field_name_works_and_warns_once(cls, deprecations) -> None:
    old = cls(reasoning_content="steps")
    assert old.reasoning == "steps" and old.reasoning_content == "steps"
    old.reasoning_content = "more"
    assert old.reasoning == "more"
    assert cls(reasoning="new", reasoning_content="old").reasoning == "new"  # the new name wins
    assert deprecations == [f"Python API {cls.__name__}.reasoning_content is deprecated since forkless 0.1.0 and "
                            f"will be removed in 0.2.0; use {cls.__name__}.reasoning instead"]


def test_a_stream_chunk_carries_both_names() -> None:
    chunk = ChatCompletionChunk(id="c", created=0, model="m",
                                choices=[ChatStreamChoice(index=0, delta=DeltaMessage(reasoning="r"))])
    delta = json.loads(chunk.model_dump_json())["choices"][0]["delta"]
    assert (delta["reasoning"], delta["reasoning_content"]) == ("r", "r")


def test_earlier_reasoning_in_the_request_reaches_the_template_under_both_names() -> None:
    for field in ("reasoning", "reasoning_content"):
        message = ChatMessage(role="assistant", content="hi", **{field: "earlier"})
        assert message.model_dump(exclude_none=True)["reasoning"] == "earlier"
        assert message.model_dump(exclude_none=True)["reasoning_content"] == "earlier"


def test_a_parsers_own_call_id_stays_out_of_the_function_object() -> None:
    call = ToolCall(function=FunctionCall(id="functions.f:0", name="f", arguments="{}"))
    assert call.function.id == "functions.f:0"
    assert json.loads(call.model_dump_json())["function"] == {"name": "f", "arguments": "{}"}


@pytest.mark.parametrize("path", [
    "forkless.entrypoints.openai.protocol",  # vLLM before 0.1x
    "forkless.entrypoints.openai.engine.protocol",  # vLLM 0.1x-0.30
    "forkless.entrypoints.openai.chat_completion.protocol",
    "forkless.entrypoints.generate.base.protocol",  # vLLM 0.31 on
])
def test_vllms_protocol_module_paths_are_forkless_protocol(path) -> None:
    module = importlib.import_module(path)
    assert module is protocol
    for name in ("DeltaMessage", "DeltaToolCall", "DeltaFunctionCall", "ExtractedToolCallInformation",
                 "FunctionCall", "ToolCall", "ChatCompletionRequest", "ChatCompletionToolsParam"):
        assert getattr(module, name) is getattr(protocol, name)


def test_vllms_parser_module_paths_give_forkless_classes() -> None:
    from forkless.entrypoints.chat_utils import make_tool_call_id
    from forkless.entrypoints.openai.responses.protocol import ResponsesRequest
    from forkless.entrypoints.openai.tool_parsers import ToolParser as OldToolParser
    from forkless.entrypoints.openai.tool_parsers.abstract_tool_parser import ToolParserManager as OldManager
    from forkless.reasoning import ReasoningParser, ReasoningParserManager
    from forkless.reasoning.abs_reasoning_parsers import ReasoningParser as AbsReasoningParser
    from forkless.reasoning.abs_reasoning_parsers import ReasoningParserManager as AbsManager
    from forkless.reasoning.basic_parsers import BaseThinkingReasoningParser
    from forkless.tokenizers import TokenizerLike
    from forkless.tool_parsers import ToolParser, ToolParserManager
    from forkless.tool_parsers.abstract_tool_parser import ToolParser as AbsToolParser

    assert OldToolParser is AbsToolParser is ToolParser and OldManager is ToolParserManager
    assert AbsReasoningParser is ReasoningParser and AbsManager is ReasoningParserManager
    assert issubclass(BaseThinkingReasoningParser, ReasoningParser)
    assert make_tool_call_id().startswith("chatcmpl-tool-") and len(make_tool_call_id()) == len("chatcmpl-tool-") + 32
    assert make_tool_call_id("kimi_k2", "get_weather", 0) == "functions.get_weather:0"
    assert isinstance(ResponsesRequest, type) and TokenizerLike is not None
