"""The built-in tool parsers on recorded outputs, whole and streamed in every split."""

from __future__ import annotations

import json

import pytest

from forkless.protocol.openai import ChatCompletionRequest
from forkless.tool_parsers import ToolParser, ToolParserManager
from forkless.tool_parsers.hermes import Hermes2ProToolParser
from forkless.tool_parsers.llama3_json import Llama3JsonToolParser
from tests.parsers.conftest import WEATHER_TOOL
from tests.parsers.recorded import HERMES, LLAMA3_JSON, MALFORMED, MALFORMED_AFTER_A_CALL
from tests.parsers.streaming import every_char, stream_tools, token_chunks, two_way_splits

CASES = [("hermes", *case) for case in HERMES] + [("llama3_json", *case) for case in LLAMA3_JSON]
IDS = [f"{name}-{i}" for name, cases in (("hermes", HERMES), ("llama3_json", LLAMA3_JSON)) for i in range(len(cases))]


def make(name: str, tokenizer=None, tools=None) -> ToolParser:
    return ToolParserManager.create(name, tokenizer, tools)


@pytest.mark.parametrize("name, output, content, calls", CASES, ids=IDS)
def test_whole_output(name, output, content, calls, request_with_tools) -> None:
    info = make(name).extract_tool_calls(output, request_with_tools)
    assert info.tools_called == bool(calls)
    assert info.content == content
    assert [(c.function.name, c.function.arguments) for c in info.tool_calls] == calls
    for c in info.tool_calls:
        assert c.type == "function" and c.id.startswith("chatcmpl-tool-")
        json.loads(c.function.arguments)
    assert len({c.id for c in info.tool_calls}) == len(calls)


def _whole(name: str, output: str, request) -> tuple[str | None, list[tuple[str, str]]]:
    info = make(name).extract_tool_calls(output, request)
    return info.content or None, [(c.function.name, c.function.arguments) for c in info.tool_calls]


@pytest.mark.parametrize("name, output, content, calls", CASES, ids=IDS)
def test_streamed_one_character_at_a_time_equals_whole(name, output, content, calls, request_with_tools) -> None:
    streamed_content, streamed_calls = stream_tools(make(name), every_char(output), request_with_tools)
    assert (streamed_content, [(c["name"], c["arguments"]) for c in streamed_calls]) == \
        _whole(name, output, request_with_tools)


@pytest.mark.parametrize("name, output, content, calls", CASES, ids=IDS)
def test_streamed_in_two_pieces_at_every_boundary_equals_whole(name, output, content, calls,
                                                               request_with_tools) -> None:
    expected = _whole(name, output, request_with_tools)
    for chunks in two_way_splits(output):
        streamed_content, streamed_calls = stream_tools(make(name), chunks, request_with_tools)
        assert (streamed_content, [(c["name"], c["arguments"]) for c in streamed_calls]) == expected, chunks


@pytest.mark.parametrize("name, output, content, calls", CASES, ids=IDS)
def test_streamed_token_by_token_equals_whole(name, output, content, calls, tokenizer, request_with_tools) -> None:
    chunks = token_chunks(tokenizer, output)
    assert len(chunks) > 1 or not output
    streamed_content, streamed_calls = stream_tools(make(name, tokenizer), chunks, request_with_tools)
    assert (streamed_content, [(c["name"], c["arguments"]) for c in streamed_calls]) == \
        _whole(name, output, request_with_tools)


@pytest.mark.parametrize("name, output", [(n, o) for m in (MALFORMED, MALFORMED_AFTER_A_CALL)
                                          for n, outs in m.items() for o in outs])
def test_malformed_calls_come_back_as_content(name, output, request_with_tools) -> None:
    info = make(name).extract_tool_calls(output, request_with_tools)
    assert not info.tools_called and info.tool_calls == [] and info.content == output


def test_streaming_sends_the_name_before_any_argument(request_with_tools) -> None:
    parser = make("hermes")
    text = '<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call>'
    seen = []
    for i in range(1, len(text) + 1):
        delta = parser.extract_tool_calls_streaming(text[:i - 1], text[:i], text[i - 1], [], [], [], request_with_tools)
        if delta and delta.tool_calls:
            seen.extend(delta.tool_calls)
    assert seen[0].function.name == "get_weather" and seen[0].function.arguments == '{"city": "Paris"}'


def test_hermes_keeps_special_tokens_only_where_the_tag_is_one(tokenizer, request_with_tools) -> None:
    # SmolLM2's vocabulary has no <tool_call> token, so nothing needs changing.
    assert make("hermes", tokenizer).adjust_request(request_with_tools).skip_special_tokens is True

    class TagTokenizer:
        def get_added_vocab(self) -> dict[str, int]:
            return {"<tool_call>": 7}

    assert make("hermes", TagTokenizer()).adjust_request(request_with_tools).skip_special_tokens is False


@pytest.mark.parametrize("cls", [Hermes2ProToolParser, Llama3JsonToolParser])
def test_constructor_takes_the_tools_and_the_base_keeps_vllms_streaming_state(cls, tokenizer) -> None:
    tools = ChatCompletionRequest(messages=[], tools=[WEATHER_TOOL]).tools
    for parser in (cls(tokenizer, tools), cls(tokenizer, tools=tools), cls(tokenizer)):
        assert parser.model_tokenizer is tokenizer
        assert (parser.prev_tool_call_arr, parser.current_tool_id, parser.current_tool_name_sent,
                parser.streamed_args_for_tool) == ([], -1, False, [])
    assert cls(tokenizer, tools=tools).tools == tools and cls(tokenizer).tools == []  # vLLM's: none is an empty list
    assert cls(tokenizer).vocab == tokenizer.get_vocab()


def test_streaming_updates_the_vllm_state(request_with_tools) -> None:
    parser = make("hermes")
    stream_tools(parser, every_char(HERMES[1][0]), request_with_tools)
    assert parser.current_tool_id == 1 and parser.current_tool_name_sent
    assert parser.prev_tool_call_arr == [{"name": "get_weather", "arguments": '{"city": "Paris"}'},
                                         {"name": "get_weather", "arguments": '{"city": "Berlin"}'}]
    assert parser.streamed_args_for_tool == ['{"city": "Paris"}', '{"city": "Berlin"}']


def test_a_parser_with_the_old_constructor_is_built_without_the_tools(request_with_tools) -> None:
    class OldConstructor(Hermes2ProToolParser):
        def __init__(self, tokenizer):
            super().__init__(tokenizer)

    ToolParserManager.register_module("test_old_constructor", module=OldConstructor)
    try:
        parser = ToolParserManager.create("test_old_constructor", None, request_with_tools.tools)
        assert isinstance(parser, OldConstructor) and parser.tools == []
    finally:
        ToolParserManager.registry.unregister("test_old_constructor")


def test_llama3_json_name_without_parameters_is_content_even_when_streamed(request_with_tools) -> None:
    # The name alone does not make a call: nothing is streamed as one, and once the object
    # closes without arguments it is sent as content.
    text = '{"name": "noargs"}'
    assert stream_tools(make("llama3_json"), every_char(text), request_with_tools) == (text, [])
