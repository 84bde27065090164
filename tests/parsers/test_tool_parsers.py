"""The built-in tool parsers on recorded outputs, whole and streamed in every split."""

from __future__ import annotations

import json

import pytest

from forkless.tool_parsers import ToolParser, ToolParserManager
from tests.parsers.recorded import HERMES, LLAMA3_JSON, MALFORMED
from tests.parsers.streaming import every_char, stream_tools, token_chunks, two_way_splits

CASES = [("hermes", *case) for case in HERMES] + [("llama3_json", *case) for case in LLAMA3_JSON]
IDS = [f"{name}-{i}" for name, cases in (("hermes", HERMES), ("llama3_json", LLAMA3_JSON)) for i in range(len(cases))]


def make(name: str, tokenizer=None) -> ToolParser:
    return ToolParserManager.get_tool_parser(name)(tokenizer)


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


@pytest.mark.parametrize("name, output", [(n, o) for n, outs in MALFORMED.items() for o in outs])
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
