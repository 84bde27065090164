"""Reasoning and tool parsers together, as the server runs them on one choice."""

from __future__ import annotations

import pytest

from forkless.entrypoints.openai.chat_parsing import make_choice_parser
from tests.parsers.recorded import DEEPSEEK_R1, HERMES, LLAMA3_JSON, MALFORMED, QWEN3
from tests.parsers.streaming import two_way_splits

THINK_THEN_CALL = ('<think>\nThe user wants the weather; I will call the tool.\n</think>\n\n'
                   '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')

OUTPUTS = [
    ("qwen3", "hermes", THINK_THEN_CALL),
    ("qwen3", "hermes", "<think>short</think>Just an answer, no call."),
    ("deepseek_r1", None, DEEPSEEK_R1[2][0]),  # ends inside "</think>": settled at the end
    ("deepseek_r1", None, DEEPSEEK_R1[3][0]),  # a newline before <think>
    ("qwen3", "hermes", QWEN3[6][0]),  # a <tool_call> ends the reasoning: the call comes at the end
    ("qwen3", "hermes", QWEN3[-1][0]),  # a call inside the think block is reasoning
    (None, "hermes", HERMES[1][0]),
    (None, "llama3_json", LLAMA3_JSON[4][0]),  # calls after leading text
    # Not calls after all. (A call cut off by max_tokens is left out: its first part was
    # streamed as a call before the end showed it broken, and a stream cannot take it back.)
    *[(None, name, out) for name, outs in MALFORMED.items() for out in outs if out.count("{") == out.count("}")],
]


def stream(parser, chunks: list[str]) -> dict:
    got = {"reasoning": "", "content": "", "calls": {}}
    text = ""
    deltas = []
    for chunk in chunks:
        text += chunk
        deltas.append(parser.step(text, []))
    deltas.append(parser.finish(text))
    for d in deltas:
        if d is None:
            continue
        got["reasoning"] += d.reasoning or ""
        got["content"] += d.content or ""
        for call in d.tool_calls or []:
            entry = got["calls"].setdefault(call.index, {"name": call.function.name, "arguments": ""})
            entry["arguments"] += call.function.arguments or ""
    return {"reasoning": got["reasoning"] or None, "content": got["content"] or None,
            "calls": [(c["name"], c["arguments"]) for _, c in sorted(got["calls"].items())]}


def whole(parser, text: str) -> dict:
    m = parser.parse_whole(text)
    return {"reasoning": m.reasoning or None, "content": m.content or None,
            "calls": [(c.function.name, c.function.arguments) for c in m.tool_calls]}


@pytest.mark.parametrize("reasoning, tools, output", OUTPUTS)
def test_stream_plus_final_top_up_equals_whole_in_every_split(reasoning, tools, output, request_with_tools) -> None:
    expected = whole(make_choice_parser(request_with_tools, None, reasoning, tools), output)
    assert stream(make_choice_parser(request_with_tools, None, reasoning, tools), list(output)) == expected
    for chunks in two_way_splits(output):
        assert stream(make_choice_parser(request_with_tools, None, reasoning, tools), chunks) == expected, chunks


def test_tool_calls_are_parsed_from_the_content_after_the_reasoning(request_with_tools) -> None:
    message = make_choice_parser(request_with_tools, None, "qwen3", "hermes").parse_whole(THINK_THEN_CALL)
    assert message.reasoning == "\nThe user wants the weather; I will call the tool.\n"
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == \
        [("get_weather", '{"city": "Paris"}')]
    assert message.content == "\n\n"  # the text between the think block and the call


def test_a_call_written_inside_the_reasoning_is_not_a_call(request_with_tools) -> None:
    text = '<think>maybe <tool_call>{"name": "f", "arguments": {}}</tool_call>?</think>No call.'
    message = make_choice_parser(request_with_tools, None, "qwen3", "hermes").parse_whole(text)
    assert message.tool_calls == [] and message.content == "No call."


def test_an_implicit_tool_call_end_gives_reasoning_then_the_call(request_with_tools) -> None:
    message = make_choice_parser(request_with_tools, None, "qwen3", "hermes").parse_whole(QWEN3[6][0])
    assert message.reasoning == "Paris needs a lookup.\n" and message.content is None
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == \
        [("get_weather", '{"city": "Paris"}')]


def test_thinking_disabled_in_the_request_makes_everything_content(request_with_tools) -> None:
    request = request_with_tools.model_copy(update={"chat_template_kwargs": {"enable_thinking": False}})
    message = make_choice_parser(request, None, "qwen3", None).parse_whole("Just an answer.")
    assert (message.reasoning, message.content) == (None, "Just an answer.")
    message = make_choice_parser(request_with_tools, None, "qwen3", None).parse_whole("Just an answer.")
    assert (message.reasoning, message.content) == ("Just an answer.", None)  # thinking, cut off


def test_a_prompt_that_closed_the_reasoning_makes_everything_content(request_with_tools, tokenizer) -> None:
    # What Qwen3's template writes for enable_thinking=False; the server asks the reasoning
    # parser's is_reasoning_end about the prompt, as vLLM does.
    closed = tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)
    opened = tokenizer.encode("<|im_start|>assistant\n<think>\n", add_special_tokens=False)
    text = "The answer.</think>ignored tag"
    parser = make_choice_parser(request_with_tools, tokenizer, "qwen3", None)
    parser.set_prompt(closed)
    assert parser.parse_whole(text).content == text and parser.parse_whole(text).reasoning is None
    assert stream(parser, list(text)) == {"reasoning": None, "content": text, "calls": []}
    parser = make_choice_parser(request_with_tools, tokenizer, "qwen3", None)
    parser.set_prompt(opened)
    assert (parser.parse_whole(text).reasoning, parser.parse_whole(text).content) == ("The answer.", "ignored tag")


def test_a_parser_that_calls_nothing_but_rewrites_the_content_says_the_same_whole_and_streamed(
        request_with_tools) -> None:
    """A tool parser's content stands even when it finds no call (one that drops markup, say):
    the whole output used to keep the raw text while the stream sent the parser's."""
    from forkless.entrypoints.openai.chat_parsing import ChoiceParser
    from forkless.protocol.openai import DeltaMessage, ExtractedToolCallInformation
    from forkless.tool_parsers import ToolParser

    class Shouting(ToolParser):
        def extract_tool_calls(self, model_output, request):
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output.upper())

        def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, *args):
            return DeltaMessage(content=delta_text.upper())

    def parser() -> ChoiceParser:
        return ChoiceParser(request_with_tools, None, Shouting(None))

    text = "Hello there, no call here."
    assert whole(parser(), text)["content"] == "HELLO THERE, NO CALL HERE."
    assert stream(parser(), list(text)) == whole(parser(), text)


def test_a_parser_returning_the_wrong_type_is_named(request_with_tools) -> None:
    """A plugin's wrong return value is an error naming the parser, the method and what it
    must return (it failed further on: "too many values to unpack", "'dict' object has no
    attribute 'tools_called'")."""
    from forkless.entrypoints.openai.chat_parsing import ChoiceParser
    from forkless.reasoning import ReasoningParser
    from forkless.tool_parsers import ToolParser

    class StrReasoning(ReasoningParser):
        def extract_reasoning(self, model_output, request):
            return model_output

        def extract_reasoning_streaming(self, *args):
            return "text"

    class DictTools(ToolParser):
        def extract_tool_calls(self, model_output, request):
            return {"tools_called": False}

        def extract_tool_calls_streaming(self, *args):
            return "text"

    with pytest.raises(TypeError, match=r"StrReasoning.extract_reasoning returned str, expected a \(reasoning"):
        ChoiceParser(request_with_tools, StrReasoning(None), None).parse_whole("x")
    with pytest.raises(TypeError, match=r"StrReasoning.extract_reasoning_streaming returned str, expected "
                                        r"DeltaMessage or None"):
        ChoiceParser(request_with_tools, StrReasoning(None), None).step("x", [])
    with pytest.raises(TypeError, match=r"DictTools.extract_tool_calls returned dict, expected "
                                        r"ExtractedToolCallInformation"):
        ChoiceParser(request_with_tools, None, DictTools(None)).parse_whole("x")
    with pytest.raises(TypeError, match=r"DictTools.extract_tool_calls_streaming returned str"):
        ChoiceParser(request_with_tools, None, DictTools(None)).step("x", [])
