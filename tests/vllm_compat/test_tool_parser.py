"""A tool parser written for vLLM, imports renamed only, works in forkless; and both
vLLM-style samples loaded by a real ``forkless serve --tool-parser-plugin FILE
--reasoning-parser-plugin FILE``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forkless.entrypoints.openai.chat_parsing import make_choice_parser
from forkless.protocol.openai import ChatCompletionRequest
from forkless.tool_parsers import ToolParser, ToolParserManager
from tests.server.conftest import start_server
from tests.server.force_tokens import PATH as FORCE
from tests.vllm_compat.test_reasoning_parser import VLLM_PATHS, renamed_imports

HERE = Path(__file__).resolve().parent
PLUGIN = HERE / "vllm_style_tool_parser.py"
REASONING_PLUGIN = HERE / "vllm_style_reasoning_parser.py"
NAME = "vllm_style_call"
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]
OUTPUT = ('Checking both. [CALL] get_weather {"city": "Paris"} [/CALL]\n'
          '[CALL] get_weather {"city": "Rome", "unit": "c"} [/CALL]')
CALLS = [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome", "unit": "c"}')]


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


@pytest.fixture(scope="module")
def plugin():
    ToolParserManager.import_tool_parser(str(PLUGIN))  # what --tool-parser-plugin does
    yield ToolParserManager.get_tool_parser(NAME)
    ToolParserManager.registry.unregister(NAME)


def request() -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MESSAGES, tools=[WEATHER_TOOL])


def stream(parser, chunks: list[str]) -> dict:
    """What a client receives, step by step and topped up at the end, as the server sends it."""
    text, deltas = "", []
    for chunk in chunks:
        text += chunk
        deltas.append(parser.step(text, []))
    deltas.append(parser.finish(text))
    got = {"content": "", "calls": {}}
    for delta in (d for d in deltas if d is not None):
        got["content"] += delta.content or ""
        for call in delta.tool_calls or []:
            if call.index not in got["calls"]:
                assert call.id.startswith("chatcmpl-tool-") and call.type == "function" and call.function.name
                got["calls"][call.index] = [call.function.name, ""]
            else:
                assert call.id is None and call.function.name is None
            got["calls"][call.index][1] += call.function.arguments or ""
    return {"content": got["content"] or None, "calls": [tuple(c) for _, c in sorted(got["calls"].items())]}


def test_the_sample_imports_only_vllms_paths_renamed() -> None:
    assert renamed_imports(PLUGIN) <= VLLM_PATHS, renamed_imports(PLUGIN) - VLLM_PATHS


def test_the_plugin_file_registers_its_parser_lazily_by_its_own_module_name(plugin) -> None:
    assert NAME in ToolParserManager.list_registered()
    assert plugin.__name__ == "CallTagToolParser" and issubclass(plugin, ToolParser)


def test_whole_and_streamed_output_through_forkless(plugin, tokenizer) -> None:
    whole = make_choice_parser(request(), tokenizer, None, NAME).parse_whole(OUTPUT)
    assert whole.content == "Checking both. "
    assert [(c.function.name, c.function.arguments) for c in whole.tool_calls] == CALLS
    ids = tokenizer.encode(OUTPUT, add_special_tokens=False)
    tokens = [tokenizer.decode(ids[:i]) for i in range(len(ids) + 1)]
    by_token = [b[len(a):] for a, b in zip(tokens, tokens[1:])]
    for chunks in (list(OUTPUT), by_token):
        assert stream(make_choice_parser(request(), tokenizer, None, NAME), chunks) == \
            {"content": "Checking both. ", "calls": CALLS}


def test_the_parser_gets_the_tools_and_keeps_vllms_state(plugin, tokenizer) -> None:
    parser = make_choice_parser(request(), tokenizer, None, NAME)
    assert parser.tools.tools == request().tools
    for i in range(1, len(OUTPUT) + 1):
        parser.step(OUTPUT[:i], [])
    state = parser.tools
    assert (state.current_tool_id, state.current_tool_name_sent) == (1, True)
    assert state.streamed_args_for_tool == [a for _, a in CALLS]
    assert state.prev_tool_call_arr == [{"name": n, "arguments": a} for n, a in CALLS]


def forced(tokenizer, text: str) -> dict:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    return {"extra_args": {"forced_token_ids": ids + [tokenizer.eos_token_id]}}


def test_forkless_serve_loads_both_plugin_files(tiny_llama: Path, tmp_path: Path, tokenizer) -> None:
    srv = start_server(tiny_llama, tmp_path, "--logits-processors", FORCE,
                       "--reasoning-parser-plugin", str(REASONING_PLUGIN), "--reasoning-parser", "vllm_style_thought",
                       "--tool-parser-plugin", str(PLUGIN), "--tool-call-parser", NAME, "--enable-auto-tool-choice",
                       env_extra={"PYTHONPATH": str(HERE.parent / "server")})
    try:
        client = srv.client()
        text = "[THOUGHT]Two cities, two calls.[/THOUGHT]" + OUTPUT
        kwargs = dict(model=client.models.list().data[0].id, messages=MESSAGES, tools=[WEATHER_TOOL],
                      extra_body=forced(tokenizer, text))
        choice = client.chat.completions.create(**kwargs).choices[0]
        message = choice.message.model_dump()
        assert message["reasoning"] == message["reasoning_content"] == "Two cities, two calls."
        assert message["content"] == "Checking both. " and choice.finish_reason == "tool_calls"
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == CALLS
        reasoning, content, calls, finish = "", "", {}, None
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                delta = c.delta.model_dump()
                assert delta.get("reasoning") == delta.get("reasoning_content")
                reasoning += delta.get("reasoning") or ""
                content += c.delta.content or ""
                for call in c.delta.tool_calls or []:
                    entry = calls.setdefault(call.index, [call.function.name, ""])
                    entry[1] += call.function.arguments or ""
                finish = c.finish_reason or finish
        assert (reasoning, content, finish) == ("Two cities, two calls.", "Checking both. ", "tool_calls")
        assert [tuple(c) for _, c in sorted(calls.items())] == CALLS
        assert [json.loads(a) for _, a in CALLS]  # valid JSON arguments
        # The reasoning parser's adjust_request returns a copy that stops before the
        # second call: the copy is the request the server runs.
        cut = client.chat.completions.create(**{**kwargs, "extra_body": {
            **forced(tokenizer, text), "chat_template_kwargs": {"answer_stop": "\n[CALL]"}}}).choices[0]
        assert [(c.function.name, c.function.arguments) for c in cut.message.tool_calls] == CALLS[:1]
        # supports_required_and_named = False: "required" is not forced into a JSON array
        # (which the forced tokens would contradict); the parser reads the calls.
        required = client.chat.completions.create(**{**kwargs, "tool_choice": "required"}).choices[0]
        assert [(c.function.name, c.function.arguments) for c in required.message.tool_calls] == CALLS
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]
