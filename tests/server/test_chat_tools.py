"""Tool calls and reasoning through the official ``openai`` client, against a real server.

The tiny model's output is forced token by token (``force_tokens.py``), so it writes a
``<think>`` block and a hermes ``<tool_call>`` exactly as a real model would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import openai
import pytest

from tests.server.conftest import Server, start_server
from tests.server.force_tokens import PATH as FORCE

HERE = Path(__file__).resolve().parent
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
REASONING = "\nThe user asks about Paris, so I will call get_weather.\n"
ARGUMENTS = '{"city": "Paris", "unit": "celsius"}'
OUTPUT = (f"<think>{REASONING}</think>\n\n<tool_call>\n"
          f'{{"name": "get_weather", "arguments": {ARGUMENTS}}}\n</tool_call>')
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def forced(tokenizer, text: str) -> dict:
    """``extra_body`` that makes the model write ``text`` and then stop."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    return {"extra_args": {"forced_token_ids": ids + [tokenizer.eos_token_id]}}


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


@pytest.fixture(scope="module")
def tool_server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tiny_llama, tmp_path_factory.mktemp("tools"), "--logits-processors", FORCE,
                       "--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3",
                       env_extra={"PYTHONPATH": str(HERE)})
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def collect_stream(stream) -> dict:
    """Concatenate a chat stream's deltas; checks the tool-call delta protocol on the way."""
    out = {"reasoning": "", "content": "", "calls": {}, "finish": None}
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            # vLLM's field is "reasoning"; "reasoning_content" (its old name) mirrors it.
            assert getattr(delta, "reasoning", None) == getattr(delta, "reasoning_content", None)
            out["reasoning"] += getattr(delta, "reasoning", None) or ""
            out["content"] += delta.content or ""
            for call in delta.tool_calls or []:
                if call.index not in out["calls"]:
                    assert call.id and call.function.name and call.type == "function"
                    out["calls"][call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
                else:
                    assert call.id is None and call.function.name is None
                out["calls"][call.index]["arguments"] += call.function.arguments or ""
            out["finish"] = choice.finish_reason or out["finish"]
    return out


def test_tool_call_and_reasoning(tool_server: Server, tokenizer) -> None:
    resp = tool_server.client().chat.completions.create(
        model=tool_server.client().models.list().data[0].id, messages=MESSAGES,
        tools=[WEATHER_TOOL], extra_body=forced(tokenizer, OUTPUT))
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning == choice.message.reasoning_content == REASONING
    (call,) = choice.message.tool_calls
    assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
    assert call.function.name == "get_weather"
    assert call.function.arguments == ARGUMENTS and json.loads(call.function.arguments)["city"] == "Paris"
    assert choice.message.content == "\n\n"  # what the model wrote between the two blocks


def test_streamed_deltas_add_up_to_the_whole_message(tool_server: Server, tokenizer) -> None:
    client = tool_server.client()
    model = client.models.list().data[0].id
    whole = client.chat.completions.create(model=model, messages=MESSAGES, tools=[WEATHER_TOOL],
                                           extra_body=forced(tokenizer, OUTPUT)).choices[0]
    streamed = collect_stream(client.chat.completions.create(
        model=model, messages=MESSAGES, tools=[WEATHER_TOOL], stream=True, extra_body=forced(tokenizer, OUTPUT)))
    assert streamed["reasoning"] == whole.message.reasoning == REASONING
    assert streamed["content"] == whole.message.content
    assert [(c["name"], c["arguments"]) for c in streamed["calls"].values()] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert streamed["calls"][0]["id"].startswith("chatcmpl-tool-")
    assert streamed["finish"] == "tool_calls"


def test_without_tools_the_call_stays_text_but_reasoning_is_split(tool_server: Server, tokenizer) -> None:
    client = tool_server.client()
    for extra in ({}, {"tools": [WEATHER_TOOL], "tool_choice": "none"}):
        choice = client.chat.completions.create(model=client.models.list().data[0].id, messages=MESSAGES,
                                                extra_body=forced(tokenizer, OUTPUT), **extra).choices[0]
        assert choice.finish_reason == "stop" and not choice.message.tool_calls
        assert choice.message.reasoning == REASONING
        assert choice.message.content.startswith("\n\n<tool_call>\n{\"name\": \"get_weather\"")


def test_usage_counts_the_reasoning_tokens_with_a_reasoning_parser(tool_server: Server, tokenizer) -> None:
    # As vLLM's: with --reasoning-parser, usage.completion_tokens_details.reasoning_tokens
    # is the parser's count of the tokens between <think> and </think>, summed over the
    # choices, in the whole reply and in a stream's usage chunk.
    client = tool_server.client()
    model = client.models.list().data[0].id
    thinking = len(tokenizer.encode(REASONING, add_special_tokens=False))
    kwargs = dict(model=model, messages=MESSAGES, extra_body=forced(tokenizer, f"<think>{REASONING}</think>\n\nHi"))
    usage = client.chat.completions.create(n=2, **kwargs).usage
    assert usage.completion_tokens_details.reasoning_tokens == 2 * thinking
    assert usage.completion_tokens > 2 * thinking
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == thinking
    # All content (the template closed the think block): none counted, still reported.
    off = {**forced(tokenizer, "Hi"), "chat_template_kwargs": {"enable_thinking": False}}
    usage = client.chat.completions.create(model=model, messages=MESSAGES, extra_body=off).usage
    assert usage.completion_tokens_details.reasoning_tokens == 0


def test_include_reasoning_false_leaves_the_reasoning_out(tool_server: Server, tokenizer) -> None:
    # vLLM's: no reasoning in the reply, whole or streamed, and no per-token logprobs or
    # token ids, which would show it; the rest of the reply (content, calls, the prompt's
    # ids, the reasoning's count in usage) is as with the reasoning.
    client = tool_server.client()
    kw = dict(model=client.models.list().data[0].id, messages=MESSAGES, tools=[WEATHER_TOOL], n=2, logprobs=True,
              top_logprobs=1)
    body = {**forced(tokenizer, OUTPUT), "return_token_ids": True}
    shown = client.chat.completions.create(extra_body=body, **kw)
    hidden = client.chat.completions.create(extra_body={**body, "include_reasoning": False}, **kw)
    assert hidden.prompt_token_ids == shown.prompt_token_ids and hidden.prompt_token_ids
    assert hidden.usage == shown.usage and hidden.usage.completion_tokens_details.reasoning_tokens > 0
    for was, choice in zip(shown.choices, hidden.choices):
        assert was.message.reasoning == REASONING and was.logprobs is not None and was.token_ids
        assert choice.message.reasoning is None and choice.message.reasoning_content is None
        assert choice.logprobs is None and choice.token_ids is None
        assert choice.message.content == was.message.content == "\n\n"
        assert [c.function.arguments for c in choice.message.tool_calls] == [ARGUMENTS]
        assert choice.finish_reason == "tool_calls"
    chunks = list(client.chat.completions.create(stream=True, extra_body={**body, "include_reasoning": False}, **kw))
    assert not any(c.logprobs or c.token_ids for chunk in chunks for c in chunk.choices)
    assert [chunk.prompt_token_ids for chunk in chunks[:2]] == [shown.prompt_token_ids] * 2  # the role chunks
    for index in range(2):
        streamed = collect_stream(chunk.model_copy(update={"choices": [c for c in chunk.choices if c.index == index]})
                                  for chunk in chunks)
        assert (streamed["reasoning"], streamed["content"], streamed["finish"]) == ("", "\n\n", "tool_calls")
        assert [c["arguments"] for c in streamed["calls"].values()] == [ARGUMENTS]


def test_with_thinking_off_an_answer_is_plain_content(tool_server: Server, tokenizer) -> None:
    client = tool_server.client()
    model = client.models.list().data[0].id
    text = "It is sunny in Paris."
    off = {**forced(tokenizer, text), "chat_template_kwargs": {"enable_thinking": False}}
    choice = client.chat.completions.create(model=model, messages=MESSAGES, tools=[WEATHER_TOOL],
                                            extra_body=off).choices[0]
    assert (choice.message.content, choice.message.reasoning, choice.finish_reason) == (text, None, "stop")
    streamed = collect_stream(client.chat.completions.create(
        model=model, messages=MESSAGES, tools=[WEATHER_TOOL], stream=True, extra_body=off))
    assert (streamed["content"], streamed["reasoning"], streamed["calls"], streamed["finish"]) == (text, "", {}, "stop")


def test_with_thinking_on_an_output_without_think_end_is_reasoning(tool_server: Server, tokenizer) -> None:
    # As vLLM's qwen3 parser: the chat template opened the think block, so an output that
    # never closes it is reasoning (the model was stopped while thinking).
    client = tool_server.client()
    text = "It is sunny in Paris."
    choice = client.chat.completions.create(model=client.models.list().data[0].id, messages=MESSAGES,
                                            extra_body=forced(tokenizer, text)).choices[0]
    assert (choice.message.content, choice.message.reasoning) == (None, text)


def test_a_constrained_request_is_all_content_under_a_reasoning_parser(tool_server: Server, tokenizer) -> None:
    # docs/plugins.md §9: this tokenizer has no one-token </think>, so the engine cannot
    # tell where reasoning ends: the constraint holds from the first token and forkless
    # runs no reasoning parser on the output (with a one-token tag the reasoning is split
    # off: tests/structured_output/test_reasoning.py).
    text = "<think>x</think>y"
    client = tool_server.client()
    for stream in (False, True):
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id, messages=MESSAGES, max_tokens=20, stream=stream,
            extra_body={**forced(tokenizer, text), "structured_outputs": {"regex": "<think>x</think>y"}})
        if stream:
            streamed = collect_stream(reply)
            assert (streamed["content"], streamed["reasoning"]) == (text, "")
        else:
            assert (reply.choices[0].message.content, reply.choices[0].message.reasoning) == (text, None)


def test_forcing_a_named_call_returns_that_call(tool_server: Server) -> None:
    # The output is held to the tool's parameters (tests/structured_output/ checks the JSON
    # on a real model; this one has random weights).
    client = tool_server.client()
    reply = client.chat.completions.create(model=client.models.list().data[0].id, messages=MESSAGES, max_tokens=8,
                                           tools=[WEATHER_TOOL],
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["get_weather"]
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(model=client.models.list().data[0].id, messages=MESSAGES,
                                       tools=[WEATHER_TOOL], tool_choice={"type": "function",
                                                                          "function": {"name": "get_time"}})


def test_parallel_tool_calls_false_keeps_the_first_call(tool_server: Server, tokenizer) -> None:
    # OpenAI's meaning: at most one call; whole and streamed alike.
    rome = '{"city": "Rome"}'
    two = OUTPUT + f'\n<tool_call>\n{{"name": "get_weather", "arguments": {rome}}}\n</tool_call>'
    client = tool_server.client()
    model = client.models.list().data[0].id
    kw = dict(model=model, messages=MESSAGES, tools=[WEATHER_TOOL], extra_body=forced(tokenizer, two))
    both = client.chat.completions.create(**kw).choices[0].message.tool_calls
    assert [c.function.arguments for c in both] == [ARGUMENTS, rome]
    one = client.chat.completions.create(parallel_tool_calls=False, **kw).choices[0].message.tool_calls
    assert [c.function.arguments for c in one] == [ARGUMENTS]
    streamed = collect_stream(client.chat.completions.create(parallel_tool_calls=False, stream=True, **kw))
    assert [c["arguments"] for c in streamed["calls"].values()] == [ARGUMENTS]


def test_tool_choice_auto_without_tools_is_a_400(tool_server: Server) -> None:
    # vLLM and OpenAI answer 400: "auto" chooses among tools, and none were given.
    client = tool_server.client()
    with pytest.raises(openai.BadRequestError, match="needs tools") as err:
        client.chat.completions.create(model=client.models.list().data[0].id, messages=MESSAGES,
                                       tool_choice="auto", max_tokens=2)
    assert err.value.body["param"] == "tool_choice"


def test_a_forced_tool_choice_with_an_invalid_schema_names_tools(tool_server: Server) -> None:
    # The constraint is the tools' parameters: the 400 names tools, not structured_outputs
    # (a field the request never had).
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}
    client = tool_server.client()
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        with pytest.raises(openai.BadRequestError, match="invalid JSON schema") as err:
            client.chat.completions.create(model=client.models.list().data[0].id, messages=MESSAGES,
                                           tools=[bad], tool_choice=choice, max_tokens=2)
        assert err.value.body["param"] == "tools" and err.value.body["message"].startswith("tools:")


@pytest.mark.parametrize("body, param", [
    ({"tools": [WEATHER_TOOL], "tool_choice": "any"}, "tool_choice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {}}}, "tool_choice"),
    ({"messages": [{"role": "tool", "tool_call_id": "c1", "content": 5}]}, "messages.0.content"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools.0.function.name"),
])
def test_a_malformed_field_is_a_400_naming_it_as_the_client_does(tool_server: Server, body: dict, param: str) -> None:
    # pydantic's location also names the member of a union that failed
    # ("tool_choice.literal['none','auto','required']"); param is the client's path.
    client = tool_server.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{"model": client.models.list().data[0].id, "messages": MESSAGES,
                                          "max_tokens": 2, **body})
    assert err.value.body["param"] == param


def test_arguments_written_as_a_plain_string_are_one_call_streamed_or_not(tool_server: Server, tokenizer) -> None:
    # The streamed call once came with the whole <tool_call> text as content too, while
    # the unstreamed reply had no call at all.
    text = '<tool_call>\n{"name": "get_weather", "arguments": "Paris"}\n</tool_call>'
    client = tool_server.client()
    kw = dict(model=client.models.list().data[0].id, messages=MESSAGES, tools=[WEATHER_TOOL],
              extra_body={**forced(tokenizer, text), "chat_template_kwargs": {"enable_thinking": False}})
    whole = client.chat.completions.create(**kw).choices[0]
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == [("get_weather", '"Paris"')]
    assert (whole.message.content, whole.finish_reason) == (None, "tool_calls")
    streamed = collect_stream(client.chat.completions.create(stream=True, **kw))
    assert [(c["name"], c["arguments"]) for c in streamed["calls"].values()] == [("get_weather", '"Paris"')]
    assert (streamed["content"], streamed["finish"]) == ("", "tool_calls")


@pytest.mark.parametrize("max_tokens", [None, 20])
def test_a_streamed_call_that_ends_broken_is_not_sent_again_as_content(tool_server: Server, tokenizer,
                                                                       max_tokens: int | None) -> None:
    # Cut by max_tokens, or stopped inside the arguments: the call's first part was already
    # streamed as a call. The stream once sent its text a second time, as content.
    text = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    client = tool_server.client()
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    streamed = collect_stream(client.chat.completions.create(
        model=client.models.list().data[0].id, messages=MESSAGES, tools=[WEATHER_TOOL], stream=True,
        max_tokens=max_tokens, extra_body={**forced(tokenizer, text), **off}))
    assert streamed["content"] == "Sure. "
    (call,) = streamed["calls"].values()
    assert call["name"] == "get_weather" and '{"city": "Pa'.startswith(call["arguments"])


def test_forced_arguments_follow_the_order_of_the_tools_properties(tool_server: Server, tokenizer) -> None:
    # The constraint once had the schema's keys sorted, so "activity" had to come before
    # "city": a model writing the properties in their declared order was refused.
    tool = {"type": "function", "function": {"name": "plan", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "activity": {"type": "string"}}}}}
    arguments = '{"city": "Nice", "activity": "swim"}'
    client = tool_server.client()
    for choice, output in (({"type": "function", "function": {"name": "plan"}}, arguments),
                           ("required", f'[{{"name": "plan", "parameters": {arguments}}}]')):
        reply = client.chat.completions.create(model=client.models.list().data[0].id, messages=MESSAGES,
                                               tools=[tool], tool_choice=choice, extra_body=forced(tokenizer, output))
        assert [c.function.arguments for c in reply.choices[0].message.tool_calls] == [arguments]


PLAN_TOOL = {"type": "function", "function": {"name": "plan", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "activity": {"type": "string"}}}}}


def test_a_required_tool_choice_streams_each_call_as_it_is_written(tool_server: Server, tokenizer) -> None:
    # As vLLM and OpenAI stream a call: its name first, then its arguments in pieces, per
    # index. "required" once sent its calls whole, in the stream's last chunk.
    first = '{"city":"Paris"}'  # as written: the unstreamed call keeps the model's spacing too
    second = ('{"city": "Saint-Remy-de-Provence", "activity": "a long walk along the canal, '
              'then lunch in the shade of the plane trees by the old fountain"}')
    output = f'[{{"name": "get_weather", "parameters": {first}}}, {{"name": "plan", "parameters": {second}}}]'
    client = tool_server.client()
    kw = dict(model=client.models.list().data[0].id, messages=MESSAGES, tools=[WEATHER_TOOL, PLAN_TOOL],
              tool_choice="required", extra_body=forced(tokenizer, output))
    whole = client.chat.completions.create(**kw).choices[0]
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == \
        [("get_weather", first), ("plan", second)]
    assert (whole.message.content, whole.finish_reason) == (None, "tool_calls")
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = collect_stream(chunks)  # checks that only a call's first delta has its id and name
    assert [(c["name"], c["arguments"]) for c in streamed["calls"].values()] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert (streamed["content"], streamed["finish"]) == ("", "tool_calls")
    deltas = [(n, call) for n, chunk in enumerate(chunks) for choice in chunk.choices
              for call in choice.delta.tool_calls or []]
    (named_0,) = [n for n, call in deltas if call.index == 0 and call.function.name]
    (named_1,) = [n for n, call in deltas if call.index == 1 and call.function.name]
    assert named_0 < named_1  # the second call is not named before the first is written
    pieces = [call.function.arguments for n, call in deltas if call.index == 1 and n > named_1]
    assert len(pieces) > 1 and all(pieces), pieces
    assert all(call.type is None and call.id is None for n, call in deltas if n > named_1)
    # Cut by max_tokens inside the second call: both replies hold the first call whole and
    # the second as far as it was written, no content (the array is not text).
    for max_tokens in (len(tokenizer.encode(output, add_special_tokens=False)) - 12,):
        whole = client.chat.completions.create(max_tokens=max_tokens, **kw).choices[0]
        streamed = collect_stream(client.chat.completions.create(stream=True, max_tokens=max_tokens, **kw))
        calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        assert calls[0] == ("get_weather", first) and calls[1][0] == "plan" and second.startswith(calls[1][1])
        assert calls[1][1] != second and (whole.message.content, whole.finish_reason) == (None, "length")
        assert [(c["name"], c["arguments"]) for c in streamed["calls"].values()] == calls
        assert (streamed["content"], streamed["finish"]) == ("", "length")


def test_the_openai_clients_stream_helper_accumulates_the_calls(tool_server: Server, tokenizer) -> None:
    # client.chat.completions.stream() replaces a call's type with each delta's: the later
    # deltas' "type": null once made it fail (AssertionError) on every streamed call.
    client = tool_server.client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    paris = '{"city": "Paris"}'  # the constraint allows the tool's properties only
    required = f'[{{"name": "get_weather", "parameters": {paris}}}]'
    for choice, text, arguments in (("auto", OUTPUT, ARGUMENTS), (named, paris, paris), ("required", required, paris)):
        with client.chat.completions.stream(model=client.models.list().data[0].id, messages=MESSAGES,
                                            tools=[WEATHER_TOOL], tool_choice=choice,
                                            extra_body=forced(tokenizer, text)) as stream:
            final = stream.get_final_completion()
        (call,) = final.choices[0].message.tool_calls
        assert (call.type, call.function.name, call.function.arguments) == ("function", "get_weather", arguments)
