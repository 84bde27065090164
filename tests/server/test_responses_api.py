"""OpenAI's Responses API (/v1/responses) through the official ``openai`` client: the same
generation as chat completions, streamed events that add up to the whole response, stored
responses and previous_response_id, function calls and reasoning as output items, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from tests.conftest import make_tiny_model
from tests.server.conftest import Server, start_server, stop_and_check, wait_until
from tests.server.force_tokens import PATH as FORCE
from tests.server.test_chat_tools import ARGUMENTS, HERE, OUTPUT, REASONING, forced

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _tokens(server: Server, messages: list[dict]) -> int:
    return httpx.post(server.url + "/tokenize", json={"model": "tiny", "messages": messages}, timeout=30).json()["count"]


def test_a_response_is_the_chat_completion_of_its_messages(server: Server) -> None:
    client = server.client()
    r = client.responses.create(model="tiny", input="Hello there", instructions="Be brief.", max_output_tokens=6,
                                temperature=0, metadata={"k": "v"})
    chat = client.chat.completions.create(model="tiny", max_tokens=6, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}])
    assert r.id.startswith("resp_") and r.object == "response" and r.metadata == {"k": "v"}
    assert r.tool_choice == "none"  # no tools: what OpenAI (and vLLM) report
    assert r.output_text == chat.choices[0].message.content
    assert (r.status, r.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    # Cut by max_output_tokens: the item is incomplete too, and the response not completed.
    assert item.status == "incomplete" and r.completed_at is None

    events = list(client.responses.create(model="tiny", input="Hello there", instructions="Be brief.",
                                          max_output_tokens=6, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text and events[-1].response.usage.output_tokens == 6
    assert [e.item.status for e in events if e.type == "response.output_item.done"] == ["incomplete"]
    # Stopped inside the same greedy text (a stop string of it): completed, and when.
    assert len(r.output_text) >= 3
    done = client.responses.create(model="tiny", input="Hello there", instructions="Be brief.", temperature=0,
                                   max_output_tokens=200, extra_body={"stop": [r.output_text[1:3]]})
    assert done.status == "completed" and done.output[-1].status == "completed"
    assert done.completed_at >= done.created_at


def test_the_response_says_what_it_sampled_with(server: Server) -> None:
    # As vLLM's: the request's temperature and top_p, else the defaults it sampled with
    # (the tiny model's generation config has none: 1), never null; streamed too.
    client = server.client()
    r = client.responses.create(model="tiny", input="Hi", max_output_tokens=1)
    assert (r.temperature, r.top_p) == (1.0, 1.0)
    r = client.responses.create(model="tiny", input="Hi", max_output_tokens=1, temperature=0, top_p=0.5)
    assert (r.temperature, r.top_p) == (0, 0.5)
    events = list(client.responses.create(model="tiny", input="Hi", max_output_tokens=1, top_p=0.5, stream=True))
    assert (events[0].response.temperature, events[-1].response.top_p) == (1.0, 0.5)


def test_previous_response_id_continues_the_conversation(server: Server) -> None:
    client = server.client()
    first = client.responses.create(model="tiny", input="First question", max_output_tokens=4, temperature=0,
                                    instructions="Not carried over.")
    second = client.responses.create(model="tiny", input="Second question", max_output_tokens=4, temperature=0,
                                     previous_response_id=first.id)
    history = [{"role": "user", "content": "First question"}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "Second question"}]
    assert second.usage.input_tokens == _tokens(server, history)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="tiny", input="Again", previous_response_id=first.id)
    assert info.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model="tiny", input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_cancel_is_refused_for_a_response_not_made_in_the_background(server: Server) -> None:
    # As vLLM's for a response that was not made in the background: a 400, not a 404
    # that says the route (or a stored response) does not exist.
    client = server.client()
    r = client.responses.create(model="tiny", input="Hi", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.cancel(r.id)
    assert info.value.body["param"] == "response_id" and "background" in info.value.message
    assert client.responses.retrieve(r.id).status == r.status
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_none")


def test_ids_are_the_servers_and_an_empty_model_is_the_served_one(server: Server) -> None:
    # A client's X-Request-Id names the engine request, not the stored response: two
    # responses never share an id (nor overwrite each other in the store).
    made = [httpx.post(server.url + "/v1/responses", json={"model": "", "input": "hi", "max_output_tokens": 1},
                       headers={"X-Request-Id": "same"}, timeout=60).json() for _ in range(2)]
    assert made[0]["id"] != made[1]["id"] and all(m["model"] == "tiny" for m in made)
    for m in made:
        assert httpx.get(server.url + f"/v1/responses/{m['id']}", timeout=30).json()["id"] == m["id"]


def test_include_of_encrypted_reasoning_is_refused(server: Server) -> None:
    # Nothing here encrypts reasoning for a stateless next turn: asked for, it is a 400,
    # not an include that returns nothing.
    r = httpx.post(server.url + "/v1/responses", json={"model": "tiny", "input": "Hi", "max_output_tokens": 1,
                                                       "include": ["reasoning.encrypted_content"]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "include", r.text


def test_include_logprobs_alone_turns_them_on(server: Server) -> None:
    r = server.client().responses.create(model="tiny", input="Hi", max_output_tokens=2, temperature=0,
                                         include=["message.output_text.logprobs"])
    logprobs = r.output[0].content[0].logprobs
    assert len(logprobs) == 2 and all(t.top_logprobs == [] for t in logprobs)


def test_top_logprobs_without_include_returns_no_logprobs(server: Server) -> None:
    # As OpenAI's and vLLM's: top_logprobs sizes the logprobs that include asks for.
    client = server.client()
    r = client.responses.create(model="tiny", input="Hi", max_output_tokens=2, top_logprobs=2)
    assert r.output[-1].content[0].logprobs is None
    events = list(client.responses.create(model="tiny", input="Hi", max_output_tokens=2, top_logprobs=2, stream=True))
    assert all(e.logprobs == [] for e in events if e.type == "response.output_text.delta")
    assert events[-1].response.output[-1].content[0].logprobs is None


def test_top_logprobs_come_with_the_text(server: Server) -> None:
    r = server.client().responses.create(model="tiny", input="Hi", max_output_tokens=3, temperature=0,
                                         top_logprobs=2, include=["message.output_text.logprobs"])
    logprobs = r.output[0].content[0].logprobs
    assert len(logprobs) == 3 and all(len(t.top_logprobs) == 2 for t in logprobs)
    assert "".join(t.token for t in logprobs) == r.output_text


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/i.png"}]}]}, "input"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input"),
    # Background responses are read from the store.
    ({"background": True, "store": False}, "store"),
    ({"max_output_tokens": 100000}, "max_output_tokens"),
    ({"reasoning": {"effort": "huge"}}, "reasoning"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"text": {"format": {"type": "yaml"}}}, "text"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"text": {"format": "json"}}, "text"),
    ({"text": {"verbosity": "low"}}, "text"),
    ({"text": {"format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}}, "text"),
    ({"reasoning": {"summary": "auto"}}, "reasoning"),
    ({"reasoning": {"budget_tokens": 100}}, "reasoning"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata"),
    ({"input": "hello world " * 3000, "max_output_tokens": 5}, "input"),
    ({"tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools"),
    ({"cache_salt": ""}, "cache_salt"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]}, "input"),
    ({"input": [{"type": "reasoning", "content": 5}, {"role": "user", "content": "x"}]}, "input"),
    ({"input": [{"type": "reasoning", "summary": [{"type": "summary_text"}]}, {"role": "user", "content": "x"}]},
     "input"),
    ({"include_reasoning": False}, "include_reasoning"),
    ({"enable_response_messages": True}, "enable_response_messages"),
    ({"kv_transfer_params": {"do_remote_prefill": True}}, "kv_transfer_params"),
    ({"watermarking": True}, "watermarking"),
    # A union field's param is the field, not the union member pydantic tried.
    ({"input": 5}, "input"),
    ({"tool_choice": "bogus"}, "tool_choice"),
    ({"stop": 5}, "stop"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(server: Server, fields: dict, param: str) -> None:
    body = {"model": "tiny", "input": "Hi", **fields}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    if param == "max_output_tokens":
        assert "max_output_tokens" in r.json()["error"]["message"]


def test_text_format_json_schema_is_the_chats_response_format(server: Server) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    client = server.client()
    r = client.responses.create(model="tiny", input="Hi", max_output_tokens=12, temperature=0,
                                text={"format": {"type": "json_schema", "name": "x", "schema": schema}})
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=12,
                                          temperature=0, response_format={"type": "json_schema",
                                                                          "json_schema": {"name": "x", "schema": schema}})
    assert r.output_text == chat.choices[0].message.content


def test_what_is_refused_passes_at_a_value_that_changes_nothing(server: Server) -> None:
    body = {"model": "tiny", "input": "Hi", "max_output_tokens": 1, "include_reasoning": True,
            "enable_response_messages": False, "max_tool_calls": None, "watermarking": False}
    assert httpx.post(server.url + "/v1/responses", json=body, timeout=30).status_code == 200


def test_stream_options_turning_obfuscation_off_is_accepted(server: Server) -> None:
    # OpenAI's Responses stream_options has one key, include_obfuscation; false (to save
    # bandwidth) changes nothing here, no stream being obfuscated, as GET's
    # include_obfuscation=false. It was a 400 that spoke of chat's usage option.
    client = server.client()
    kwargs = dict(model="tiny", input="Hi", max_output_tokens=2, stream=True)
    for options in ({"include_obfuscation": False}, {}):
        events = list(client.responses.create(stream_options=options, **kwargs))
        assert events[-1].type == "response.incomplete"
        events = list(client.responses.create(stream_options=options, background=True, **kwargs))
        assert events[-1].type == "response.incomplete"
    for options in ({"include_obfuscation": True}, {"include_usage": True}):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(stream_options=options, **kwargs)
        assert info.value.body["param"] == "stream_options" and "include_obfuscation" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tiny", input="Hi", max_output_tokens=2,
                                stream_options={"include_obfuscation": False})
    assert info.value.body["param"] == "stream_options" and "stream" in info.value.message


@pytest.fixture(scope="module")
def tool_server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tiny_llama, tmp_path_factory.mktemp("responses-tools"), "--logits-processors", FORCE,
                       "--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3",
                       "--served-model-name", "tiny", env_extra={"PYTHONPATH": str(HERE)})
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


def test_reasoning_and_function_calls_are_output_items(tool_server: Server, tokenizer) -> None:
    client = tool_server.client()
    kwargs = dict(model="tiny", input="What is the weather in Paris?", tools=[WEATHER],
                  extra_body=forced(tokenizer, OUTPUT))
    r = client.responses.create(**kwargs)
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"]
    assert r.output[0].content[0].text == REASONING
    call = r.output[2]
    assert (call.name, call.arguments) == ("get_weather", ARGUMENTS) and call.call_id
    assert r.status == "completed"

    events = list(client.responses.create(stream=True, **kwargs))
    final = events[-1].response
    assert events[-1].type == "response.completed"
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == REASONING
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == ARGUMENTS
    assert final.output[2].arguments == ARGUMENTS
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    done = [e.item.type for e in events if e.type == "response.output_item.done"]
    assert added == done == ["reasoning", "message", "function_call"]

    # The call's result goes back as a function_call_output item of the next turn.
    follow = client.responses.create(model="tiny", previous_response_id=r.id, tools=[WEATHER], max_output_tokens=2,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": json.dumps({"temperature": 21})}])
    assert follow.status in ("completed", "incomplete") and follow.usage.input_tokens > r.usage.input_tokens


def test_output_items_sent_back_as_input_are_the_previous_response(tool_server: Server, tokenizer) -> None:
    # OpenAI's two ways of carrying a conversation on, the output items appended to the
    # input or previous_response_id, make the same prompt: a message and the function call
    # after it are one assistant turn.
    client = tool_server.client()
    r = client.responses.create(model="tiny", input="What is the weather in Paris?", tools=[WEATHER],
                                extra_body=forced(tokenizer, OUTPUT))
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"]
    result = {"type": "function_call_output", "call_id": r.output[2].call_id, "output": "21 C"}
    chained = client.responses.create(model="tiny", previous_response_id=r.id, input=[result], tools=[WEATHER],
                                      max_output_tokens=1)
    items = [o.model_dump(exclude_none=True) for o in r.output]
    manual = client.responses.create(model="tiny", tools=[WEATHER], max_output_tokens=1, input=[
        {"role": "user", "content": "What is the weather in Paris?"}, *items, result])
    assert manual.usage.input_tokens == chained.usage.input_tokens


def test_streamed_logprobs_are_the_unstreamed_ones(tool_server: Server, tokenizer) -> None:
    # Every token's logprobs, as unstreamed: the reasoning's (before the message opens) and
    # the EOS's (a token with no text) included, in output_text.delta events.
    client = tool_server.client()
    kwargs = dict(model="tiny", input="Hi", top_logprobs=1, include=["message.output_text.logprobs"],
                  extra_body=forced(tokenizer, f"<think>{REASONING}</think>\n\nHello there"))
    whole = [t.token for t in client.responses.create(**kwargs).output[1].content[0].logprobs]
    assert whole[-1] == tokenizer.eos_token and len(whole) > len(tokenizer.encode("Hello there")) + 1
    events = list(client.responses.create(stream=True, **kwargs))
    streamed = [t.token for e in events if e.type == "response.output_text.delta" for t in e.logprobs]
    assert streamed == whole
    assert [t.token for t in events[-1].response.output[1].content[0].logprobs] == whole


def test_streamed_logprobs_after_the_text_are_the_unstreamed_ones(tool_server: Server, tokenizer) -> None:
    # A text, then a function call, then the EOS: unstreamed, the message's logprobs are
    # every token's; streamed, the call's tokens and the EOS keep theirs too (in
    # output_text.delta events before the message is done), and items still come one
    # after the other.
    client = tool_server.client()
    kwargs = dict(model="tiny", input="Weather?", tools=[WEATHER], top_logprobs=1,
                  include=["message.output_text.logprobs"], extra_body=forced(tokenizer, OUTPUT))
    whole = client.responses.create(**kwargs)
    assert [o.type for o in whole.output] == ["reasoning", "message", "function_call"]
    tokens = [t.token for t in whole.output[1].content[0].logprobs]
    assert tokens[-1] == tokenizer.eos_token
    events = list(client.responses.create(stream=True, **kwargs))
    assert [t.token for e in events if e.type == "response.output_text.delta" for t in e.logprobs] == tokens
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert [t.token for t in done.logprobs] == tokens
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert [t.token for t in final.output[1].content[0].logprobs] == tokens
    assert final.output[2].arguments == ARGUMENTS
    order = [(e.type, e.output_index) for e in events if e.type.startswith("response.output_item.")]
    assert order == [(f"response.output_item.{kind}", i) for i in range(3) for kind in ("added", "done")]


def test_a_streamed_answer_of_reasoning_alone_ends_with_an_empty_message(tool_server: Server, tokenizer) -> None:
    # As unstreamed: an output with no function call has a message, empty if need be.
    client = tool_server.client()
    kwargs = dict(model="tiny", input="Hi", extra_body=forced(tokenizer, f"<think>{REASONING}</think>"))
    whole = client.responses.create(**kwargs)
    assert [(o.type, o.content[0].text) for o in whole.output] == [("reasoning", REASONING), ("message", "")]
    events = list(client.responses.create(stream=True, **kwargs))
    final = events[-1].response
    assert [(o.type, o.content[0].text) for o in final.output] == [("reasoning", REASONING), ("message", "")]
    assert [e.item.type for e in events if e.type == "response.output_item.done"] == ["reasoning", "message"]


def test_the_store_drops_the_oldest_past_its_count_or_size() -> None:
    from forkless.entrypoints.openai.errors import BadRequest
    from forkless.entrypoints.openai.serving_responses import ResponsesStore

    store = ResponsesStore(size=2, max_chars=400)
    for i in range(3):
        store.put({"id": f"r{i}"}, [{"role": "user", "content": "x" * 10}])
    with pytest.raises(BadRequest):
        store.get("r0")
    assert store.get("r2")[0] == {"id": "r2"}
    store.put({"id": "big"}, [{"role": "user", "content": "y" * 300}])  # fits alone: the older go
    with pytest.raises(BadRequest):
        store.get("r1")
    store.put({"id": "huge"}, [{"role": "user", "content": "z" * 500}])  # over the whole budget: not kept
    with pytest.raises(BadRequest):
        store.get("huge")
    assert store.get("big")[0] == {"id": "big"}
    for _ in range(5):  # the same id again: its size is counted once
        store.put({"id": "big"}, [{"role": "user", "content": "y" * 300}])
    store.put({"id": "small"}, [{"role": "user", "content": "s"}])
    assert store.get("big")[0] == {"id": "big"} and store.get("small")[0] == {"id": "small"}


def _chat_of(tool_server: Server, fields: dict) -> tuple:
    """The chat completion of ``Hi`` with ``fields``: its reasoning, text and token count."""
    chat = httpx.post(tool_server.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 6, **fields}).json()
    message = chat["choices"][0]["message"]
    return message["reasoning"] or "", message["content"] or "", chat["usage"]["completion_tokens"]


@pytest.mark.parametrize("fields", [
    {"seed": 7, "temperature": 1.0},
    {"logit_bias": {"33662": 100}, "temperature": 0},
    {"presence_penalty": 2.0, "frequency_penalty": 2.0, "temperature": 0},
    {"stop": ["there"], "forced": "Hello there"},
    {"stop": ["there"], "include_stop_str_in_output": True, "forced": "Hello there"},
    {"ignore_eos": True, "forced": ""},
    {"skip_special_tokens": False, "forced": "<|im_start|>Hello"},
    {"chat_template_kwargs": {"enable_thinking": False}, "forced": "Hello there"},
    {"structured_outputs": {"choice": ["yes", "no"]}, "temperature": 0},
])
def test_vllms_sampling_fields_are_the_chat_completions(tool_server: Server, tokenizer, fields: dict) -> None:
    # vLLM's Responses extensions are honoured as on chat completions, not dropped.
    fields = dict(fields)
    if "forced" in fields:
        fields.update(forced(tokenizer, fields.pop("forced")))
    r = httpx.post(tool_server.url + "/v1/responses", timeout=60,
                   json={"model": "tiny", "input": "Hi", "max_output_tokens": 6, **fields}).json()
    reasoning = "".join(o["content"][0]["text"] for o in r["output"] if o["type"] == "reasoning")
    text = "".join(o["content"][0]["text"] for o in r["output"] if o["type"] == "message")
    assert (reasoning, text, r["usage"]["output_tokens"]) == _chat_of(tool_server, fields)


@pytest.mark.parametrize(("fields", "param"), [
    ({"structured_outputs": {"bogus": 1}}, "structured_outputs"),
    ({"structured_outputs": {"choice": ["a"]}, "text": {"format": {"type": "json_object"}}}, "structured_outputs"),
    ({"logit_bias": {"1": 500}}, "logit_bias"),
])
def test_bad_vllm_fields_are_a_400_naming_them(server: Server, fields: dict, param: str) -> None:
    r = httpx.post(server.url + "/v1/responses", json={"model": "tiny", "input": "Hi", **fields}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def _events(response: httpx.Response) -> Iterator[dict]:
    """The JSON bodies of a Responses stream's events, as they come."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[len("data: "):])


def test_usage_counts_the_prompt_tokens_found_in_the_prefix_cache(server: Server) -> None:
    # As vLLM's Responses API (always, where chat completions needs
    # --enable-prompt-tokens-details): input_tokens_details.cached_tokens is the prefix
    # cache's hits for the prompt, streamed or not; they used to be reported as 0.
    from tests.security.test_cache_salt import BLOCK, cached_tokens, long_prompt

    client = server.client()
    kwargs = dict(model="tiny", input=long_prompt(), max_output_tokens=1, temperature=0)
    answers = []
    hits = [cached_tokens(server, lambda: answers.append(client.responses.create(**kwargs))) for _ in range(2)]
    # (The first may hit the chat template's opening, which other tests' prompts share.)
    assert hits[1] >= hits[0] + 6 * BLOCK
    assert [r.usage.input_tokens_details.cached_tokens for r in answers] == hits
    assert hits[1] < answers[1].usage.input_tokens  # the last prompt token is always computed
    streamed = []
    hit = cached_tokens(server, lambda: streamed.extend(client.responses.create(stream=True, **kwargs)))
    assert hit == hits[1] and streamed[-1].response.usage.input_tokens_details.cached_tokens == hit
    assert client.responses.retrieve(answers[1].id).usage.input_tokens_details.cached_tokens == hits[1]


def test_a_stream_the_client_leaves_is_stored_as_cancelled(server: Server) -> None:
    # As OpenAI's: the stored response says what became of it (it was not found at all).
    body = {"model": "tiny", "input": "A long story:", "max_output_tokens": 200, "ignore_eos": True,
            "temperature": 0, "stream": True}
    text = ""
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        for event in _events(resp):
            if event["type"] == "response.created":
                response_id = event["response"]["id"]
            elif event["type"] == "response.output_text.delta":
                text += event["delta"]
                if len(text) > 5:
                    break  # leaving the block closes the connection mid-stream
    client = server.client()

    def stored():
        try:
            return client.responses.retrieve(response_id)
        except openai.NotFoundError:
            return None

    r = wait_until(stored, 15)
    assert r is not None and r.status == "cancelled" and r.error is None
    assert r.output_text.startswith(text) and 0 < r.usage.output_tokens < 200 and r.usage.input_tokens > 0


def test_input_items_are_not_listed_and_say_so(server: Server) -> None:
    # vLLM serves no input_items route, nor item_reference input items: each is a 4xx
    # that names it, not a 500 or a bare "no route".
    client = server.client()
    r = client.responses.create(model="tiny", input="Hi", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.input_items.list(r.id)
    assert "input_items" in info.value.message and info.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_none")
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tiny", input=[{"type": "item_reference", "id": r.output[0].id}])
    assert "item_reference" in info.value.message and info.value.body["param"] == "input"



def test_retrieve_refuses_the_query_parameters_it_cannot_honour(server: Server) -> None:
    # OpenAI's GET takes stream / starting_after (a background response's events replayed)
    # and include: a value it cannot honour is a 400 naming it, never ignored.
    client = server.client()
    r = client.responses.create(model="tiny", input="Hi", max_output_tokens=1)
    assert client.responses.retrieve(r.id).id == r.id
    assert client.responses.retrieve(r.id, stream=False, include_obfuscation=False).id == r.id
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.retrieve(r.id, stream=True)  # its events were never kept
    assert info.value.body["param"] == "stream" and "background" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.retrieve(r.id, include=["message.output_text.logprobs"])
    assert info.value.body["param"].startswith("include")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_none", stream=True)
    background = client.responses.create(model="tiny", input="Hi", max_output_tokens=1, background=True)
    url = f"{server.url}/v1/responses/{background.id}"
    for query, param in [("stream=true&starting_after=abc", "starting_after"),
                         ("stream=true&starting_after=1.5", "starting_after"),
                         ("stream=true&starting_after=-2", "starting_after"),
                         ("stream=true&starting_after=" + "9" * 19, "starting_after"),
                         ("starting_after=3", "starting_after"),  # without stream, it says nothing
                         ("stream=maybe", "stream"), ("stream=", "stream"),
                         ("stream=true&include_obfuscation=true", "include_obfuscation"),
                         ("stream=true&include_obfuscation=no", "include_obfuscation"),
                         ("stream=true&after=3", "after")]:
        reply = httpx.get(f"{url}?{query}", timeout=30)
        assert reply.status_code == 400, (query, reply.text)
        assert reply.json()["error"]["param"] == param and reply.json()["error"]["type"] == "BadRequestError", query
        if "9" * 19 in query:
            assert "expected an integer from -1 to 999999999999999999" in reply.json()["error"]["message"]
    reply = httpx.get(f"{url}?stream=true&starting_after=-1&include_obfuscation=false", timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    assert [e["sequence_number"] for e in _events(reply)][0] == 0

# A tool parser that, besides raising on BOOM (in the chat stream), streams on ODD the
# opening delta of a call (its id and type, no function yet) with an index it set after
# making the delta, a list: pydantic checks no assignment, the chat stream sends it on,
# and the Responses events cannot key a call by it.
ODD_PARSER = """
from forkless.protocol.openai import DeltaToolCall


@ToolParserManager.register_module("odd_calls")
class OddCalls(FailsOnBoom):
    def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, *args):
        if "ODD" in current_text and "ODD" not in previous_text:
            call = DeltaToolCall(index=0, id="call_odd", type="function")
            call.index = [0]
            return DeltaMessage(tool_calls=[call])
        return super().extract_tool_calls_streaming(previous_text, current_text, delta_text, *args)
"""


@pytest.fixture(scope="module")
def failing_server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose tool parser raises on a text with BOOM in it, mid-stream (and
    streams a call the Responses events cannot take on ODD)."""
    from tests.server.test_parser_plugins import FAILING_PARSER

    tmp = tmp_path_factory.mktemp("responses-failing")
    (tmp / "failing_parser.py").write_text(FAILING_PARSER + ODD_PARSER)
    srv = start_server(tiny_llama, tmp, "--tool-parser-plugin", str(tmp / "failing_parser.py"), "--tool-call-parser",
                       "odd_calls", "--enable-auto-tool-choice", "--logits-processors", FORCE,
                       "--served-model-name", "tiny", env_extra={"PYTHONPATH": str(HERE)})
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def test_a_stream_that_fails_is_stored_as_failed(failing_server: Server, tokenizer) -> None:
    # As OpenAI's: GET says what the stream's response.failed said (it was not found at all).
    body = {"model": "tiny", "input": "Weather?", "tools": [WEATHER], "stream": True,
            **forced(tokenizer, "It went BOOM there.")}
    with httpx.stream("POST", failing_server.url + "/v1/responses", json=body, timeout=60) as resp:
        events = list(_events(resp))
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and "IndexError" in failed["error"]["message"]
    stored = httpx.get(f"{failing_server.url}/v1/responses/{failed['id']}", timeout=30)
    assert stored.status_code == 200 and stored.json() == failed
    unstored = dict(body, store=False)
    with httpx.stream("POST", failing_server.url + "/v1/responses", json=unstored, timeout=60) as resp:
        gone = [e for e in _events(resp) if e["type"] == "response.failed"][0]["response"]["id"]
    with pytest.raises(openai.NotFoundError):
        failing_server.client().responses.retrieve(gone)


def test_a_stream_whose_events_fail_ends_with_response_failed_and_is_stored(failing_server: Server,
                                                                            tokenizer) -> None:
    # A failure in making the Responses events themselves (not in the chat stream under
    # them) used to drop the connection mid-stream, with nothing stored.
    body = {"model": "tiny", "input": "Weather?", "tools": [WEATHER], "stream": True, "max_output_tokens": 50,
            **forced(tokenizer, "Hello there ODD call.")}
    with httpx.stream("POST", failing_server.url + "/v1/responses", json=body, timeout=60) as resp:
        events = list(_events(resp))
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    failed = events[-1]["response"]
    message = failed["error"]["message"]
    assert failed["status"] == "failed" and message.startswith("internal error: TypeError")
    assert "Traceback" not in message and events[-2]["message"] == message
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # What was streamed before is kept, its open message marked incomplete.
    (item,) = failed["output"]
    assert item["status"] == "incomplete" and item["content"][0]["text"].startswith("Hello there")
    assert failed["usage"]["output_tokens"] > 0
    stored = httpx.get(f"{failing_server.url}/v1/responses/{failed['id']}", timeout=30)
    assert stored.status_code == 200 and stored.json() == failed
    assert "Responses stream" in failing_server.log()
    # The server serves on, and the official client reads the failure as such.
    events = list(failing_server.client().responses.create(model="tiny", input="Hi", tools=[WEATHER], stream=True,
                                                          extra_body=forced(tokenizer, "ODD")))
    assert events[-1].type == "response.failed" and events[-1].response.status == "failed"


def test_usage_counts_the_reasoning_tokens(tool_server: Server, tokenizer) -> None:
    # As vLLM's: output_tokens_details.reasoning_tokens are the reasoning parser's count
    # of the output's tokens between <think> and </think> (they were always 0).
    client = tool_server.client()
    kwargs = dict(model="tiny", input="Hi", extra_body=forced(tokenizer, f"<think>{REASONING}</think>\n\nHello there"))
    thinking = len(tokenizer.encode(REASONING, add_special_tokens=False))
    r = client.responses.create(**kwargs)
    assert r.output[0].type == "reasoning" and r.usage.output_tokens_details.reasoning_tokens == thinking
    assert r.usage.output_tokens > thinking
    events = list(client.responses.create(stream=True, **kwargs))
    assert events[-1].response.usage.output_tokens_details.reasoning_tokens == thinking
    assert client.responses.retrieve(events[-1].response.id).usage.output_tokens_details.reasoning_tokens == thinking
    # No reasoning (the template turned thinking off: it is all content): none counted.
    extra = forced(tokenizer, "Hello there")
    r = client.responses.create(model="tiny", input="Hi", extra_body={**extra, "chat_template_kwargs": {
        "enable_thinking": False}})
    assert [o.type for o in r.output] == ["message"] and r.usage.output_tokens_details.reasoning_tokens == 0


def test_a_background_response_is_queued_then_read_from_the_store(server: Server) -> None:
    # As OpenAI's and vLLM's: the answer comes at once, queued (or already running), and
    # GET shows it as it stands until it has ended; it was a 400.
    client = server.client()
    kwargs = dict(model="tiny", input="Hello there", instructions="Be brief.", max_output_tokens=6, temperature=0)
    r = client.responses.create(background=True, **kwargs)
    assert r.background is True and r.status in ("queued", "in_progress") and r.output == [] and r.usage is None

    def ended():
        got = client.responses.retrieve(r.id)
        return got if got.status not in ("queued", "in_progress") else None

    done = wait_until(ended, 60, 0.05)
    same = client.responses.create(**kwargs)
    assert done is not None and (done.status, done.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert done.background is True and same.background is False
    assert done.output_text == same.output_text and done.usage.output_tokens == 6
    assert (done.id, done.created_at) == (r.id, r.created_at)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.cancel(r.id)  # it has ended
    assert info.value.body["param"] == "response_id" and "incomplete" in info.value.message
    # It carries a conversation on as any stored response does.
    follow = client.responses.create(model="tiny", input="And?", max_output_tokens=2, previous_response_id=r.id)
    assert follow.usage.input_tokens > same.usage.input_tokens
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_a_background_stream_is_its_events_and_a_replay_is_the_same(server: Server) -> None:
    # As vLLM's and OpenAI's: background with stream answers with the response's events
    # while it runs in the background; GET ?stream=true replays them (it was a 400).
    client = server.client()
    kwargs = dict(model="tiny", input="Hello there", max_output_tokens=8, temperature=0)
    live = list(client.responses.create(background=True, stream=True, **kwargs))
    assert [e.sequence_number for e in live] == list(range(len(live)))
    assert live[0].type == "response.created" and live[-1].type == "response.incomplete"
    final = live[-1].response
    assert final.background is True and final.usage.output_tokens == 8
    text = "".join(e.delta for e in live if e.type == "response.output_text.delta")
    assert text == final.output_text == client.responses.create(**kwargs).output_text
    stored = client.responses.retrieve(final.id)
    assert stored.model_dump() == final.model_dump()
    # A replay of a finished one is its events, whole, then the end.
    replay = list(client.responses.retrieve(final.id, stream=True))
    assert [e.model_dump() for e in replay] == [e.model_dump() for e in live]
    later = list(client.responses.retrieve(final.id, stream=True, starting_after=3))
    assert [e.model_dump() for e in later] == [e.model_dump() for e in live[4:]]
    assert list(client.responses.retrieve(final.id, stream=True, starting_after=len(live) + 5)) == []
    # A background response made without stream keeps its events too.
    queued = client.responses.create(background=True, **kwargs)
    events = list(client.responses.retrieve(queued.id, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == text
    assert events[-1].response.id == queued.id


def test_the_events_of_a_background_response_are_kept_within_a_bound() -> None:
    import asyncio

    from forkless.entrypoints.openai.errors import BadRequest
    from forkless.entrypoints.openai.serving_responses import ResponseEvents, _event

    async def scenario() -> None:
        kept = ResponseEvents(max_chars=1000)
        events = [_event("response.output_text.delta", i, delta="x" * 40) for i in range(40)]
        follower = kept.follow(-1)
        assert kept.check_after(-1) is None
        first = asyncio.ensure_future(follower.__anext__())
        await asyncio.sleep(0)
        assert not first.done()  # waits for the first event
        kept.add(events[0])
        assert await first == events[0]
        for event in events[1:]:
            kept.add(event)
        # The oldest were dropped past the bound: a replay from before them is refused,
        # a reader that fell behind them is told so, and ends.
        assert 0 < kept.first and kept.chars <= 1000 and kept.next_sequence == 40
        with pytest.raises(BadRequest) as info:
            kept.check_after(kept.first - 2)
        assert info.value.param == "starting_after" and str(kept.first - 1) in info.value.message
        behind = json.loads((await follower.__anext__()).split("data: ")[1])
        assert behind["type"] == "error" and behind["code"] == "events_dropped"
        with pytest.raises(StopAsyncIteration):
            await follower.__anext__()
        late = kept.follow(kept.first - 1)
        assert [await late.__anext__() for _ in range(kept.next_sequence - kept.first)] == events[kept.first:]
        waiting = asyncio.ensure_future(late.__anext__())
        await asyncio.sleep(0)
        kept.end()
        with pytest.raises(StopAsyncIteration):
            await waiting

    asyncio.run(scenario())


def test_the_running_background_responses_events_share_one_bound() -> None:
    # Many long background responses cannot make the API server hold more than the
    # budget's characters of events between them: the one adding drops its oldest.
    from forkless.entrypoints.openai.serving_responses import EventBudget, ResponseEvents, _event

    events = [_event("response.output_text.delta", i, delta="x" * 40) for i in range(30)]
    size = len(events[0])
    budget = EventBudget(limit=16 * size)
    a, b = ResponseEvents(max_chars=12 * size, budget=budget), ResponseEvents(max_chars=12 * size, budget=budget)
    for event in events[:10]:
        a.add(event)
    assert a.first == 0 and budget.chars == a.chars == 10 * size  # under both bounds: all kept
    for event in events:
        b.add(event)
        assert budget.chars == a.chars + b.chars <= 16 * size
    assert a.first == 0 and b.first > 0  # b, the one adding, gave up its oldest
    assert b.next_sequence == 30 and b.events[-1] == events[-1] and b.chars <= 6 * size
    a.end()  # an ended response's events are the store's to count
    assert budget.chars == b.chars
    for event in events[:20]:
        b.add(event)
    assert 6 * size < b.chars <= 12 * size  # the room a left is b's now, within its own bound
    b.end()
    assert budget.chars == 0


def test_the_store_never_drops_a_running_background_response() -> None:
    from forkless.entrypoints.openai.errors import BadRequest
    from forkless.entrypoints.openai.serving_responses import ResponseEvents, ResponsesStore, _event

    store = ResponsesStore(size=2, max_chars=2000)
    events = ResponseEvents()
    store.put({"id": "a", "status": "queued"}, [], events)
    store.put({"id": "a", "status": "in_progress"}, [])
    for i in range(3):  # ended ones go first
        store.put({"id": f"s{i}", "status": "completed"}, [])
    assert store.get("a")[0]["status"] == "in_progress" and store.events("a") is events
    store.put({"id": "b", "status": "queued"}, [])
    with pytest.raises(BadRequest):
        store.get("s2")
    # Full of running ones: a new background one is refused, an ended one is not kept.
    with pytest.raises(BadRequest) as info:
        store.check_room()
    assert info.value.status == 429 and info.value.param == "background"
    with pytest.raises(BadRequest) as info:
        store.put({"id": "c", "status": "queued"}, [])
    assert info.value.status == 429
    store.put({"id": "s3", "status": "completed"}, [])
    with pytest.raises(BadRequest):
        store.get("s3")
    # Ended, it keeps its events, which then count in the store's characters.
    store.put({"id": "a", "status": "completed"}, [{"role": "assistant", "content": "x"}])
    assert store.events("a") is events
    events.add(_event("response.completed", 0, response={"id": "a", "text": "y" * 500}))
    store.settle("a")
    assert store.events("a") is events and store._chars > 500
    events.add(_event("response.completed", 1, response={"id": "a", "text": "y" * 2000}))
    store.settle("a")  # too large for the store: the events go, the response stays
    assert store.events("a") is None and store.get("a")[0]["status"] == "completed"
    store.check_room()
    store.put({"id": "c", "status": "queued"}, [], ResponseEvents())
    store.delete("c")
    assert store.events("c") is None


def test_a_background_run_that_fails_before_its_stream_ends_failed() -> None:
    # It stayed in_progress for ever, and so in the store, its readers waiting.
    import asyncio
    import types

    from forkless.entrypoints.openai.serving_responses import OpenAIServingResponses
    from forkless.protocol.openai import ResponsesRequest

    serving = OpenAIServingResponses(types.SimpleNamespace(sampling_defaults={}, model_name="tiny"))

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    serving._stream = broken

    async def chunks():
        yield ""

    async def scenario() -> list[str]:
        request = ResponsesRequest(model="tiny", input="Hi", background=True)
        _, kept = await serving._start_background(request, chunks(), [], "resp_x", False)
        reader = kept.follow(-1)
        await asyncio.gather(*(run.task for run in serving._background.values()), return_exceptions=True)
        return [event async for event in reader]

    (event,) = asyncio.run(scenario())
    failed = serving.store.get("resp_x")[0]
    assert failed["status"] == "failed" and failed["error"]["message"] == "internal error: RuntimeError: boom"
    assert json.loads(event.split("data: ")[1]) == {"type": "response.failed", "sequence_number": 0,
                                                     "response": failed}
    assert serving.num_background == 0


@pytest.fixture(scope="module")
def long_model(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with room for 16,000-token generations: minutes of work, still
    running when a test cancels it (the shared server's 256 tokens take a third of a
    second)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-16k"), smollm2_folder, max_position_embeddings=16384)


def _start_long_server(model: Path, tmp: Path) -> Server:
    return start_server(model, tmp, "--served-model-name", "tiny", "--max-model-len", "16384")


@pytest.fixture(scope="module")
def long_server(long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start_long_server(long_model, tmp_path_factory.mktemp("responses-long"))
    yield srv
    assert stop_and_check(srv) == 0, srv.log()[-3000:]


LONG = dict(model="tiny", input="A long story:", max_output_tokens=16000, temperature=0,
            extra_body={"ignore_eos": True})


def _running(srv: Server) -> float:
    from tests.server.test_metrics import scrape, value

    return value(scrape(srv), "forkless:num_requests_running")


def _started_in_background(srv: Server) -> str:
    """The id of a long background response, once the engine runs it."""
    r = srv.client().responses.create(background=True, **LONG)
    assert wait_until(lambda: _running(srv) >= 1, 60, 0.05), srv.log()[-3000:]
    assert srv.client().responses.retrieve(r.id).status == "in_progress"
    return r.id


def test_cancelling_a_background_response_aborts_its_request(long_server: Server) -> None:
    client = long_server.client()
    response_id = _started_in_background(long_server)
    # Its conversation is not whole yet: nothing can follow it.
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tiny", input="Next", previous_response_id=response_id)
    assert info.value.body["param"] == "previous_response_id" and "in_progress" in info.value.message
    cancelled = client.responses.cancel(response_id)
    assert cancelled.id == response_id and cancelled.status == "cancelled" and cancelled.background is True
    assert cancelled.usage.output_tokens < 16000
    # The engine request was aborted before the answer, and the store says cancelled.
    assert wait_until(lambda: _running(long_server) == 0, 10, 0.05)
    assert client.responses.retrieve(response_id).status == "cancelled"
    assert client.responses.cancel(response_id).status == "cancelled"  # again: the same answer
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_none")


def test_deleting_a_background_response_aborts_it_for_good(long_server: Server) -> None:
    client = long_server.client()
    response_id = _started_in_background(long_server)
    # Readers that follow it (from the first, from later, past its end) end with it, in
    # order, each where it started.
    threads, got = _follow_in_threads(long_server, response_id, [None, 0, 4, 10**17])
    assert wait_until(lambda: all(len(got[after]) > 6 for after in (None, 0, 4)), 30, 0.05)
    gone = httpx.delete(f"{long_server.url}/v1/responses/{response_id}", timeout=30)
    assert gone.status_code == 200 and gone.json() == {"id": response_id, "object": "response", "deleted": True}
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    events = got[None]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.cancelled" and events[-1]["response"]["id"] == response_id
    assert (got[0], got[4], got[10**17]) == (events[1:], events[5:], [])
    assert wait_until(lambda: _running(long_server) == 0, 10, 0.05)
    # Its end, cancelled, was not stored again after the delete.
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response_id)


def _follow_in_threads(srv: Server, response_id: str, starting_after: list[int | None]) -> tuple[list, dict]:
    """Readers of a background response's events (GET ?stream=true), each in a thread:
    the threads, and each reader's events (by its starting_after) as they come."""
    import threading

    got: dict = {after: [] for after in starting_after}

    def read(after: int | None) -> None:
        query = "" if after is None else f"&starting_after={after}"
        with httpx.stream("GET", f"{srv.url}/v1/responses/{response_id}?stream=true{query}", timeout=30) as resp:
            for event in _events(resp):
                got[after].append(event)

    threads = [threading.Thread(target=read, args=(after,), daemon=True) for after in starting_after]
    for thread in threads:
        thread.start()
    return threads, got


def test_shutdown_cancels_the_background_responses(long_model: Path, tmp_path: Path) -> None:
    # They have no connection for the drain to wait on: the server cancels them (their
    # engine requests aborted) before it stops the engine, and exits cleanly; their
    # readers end with response.cancelled, not held open until the drain gives up.
    import signal

    srv = _start_long_server(long_model, tmp_path)
    try:
        response_id = _started_in_background(srv)
        threads, got = _follow_in_threads(srv, response_id, [None, 1])
        assert wait_until(lambda: all(len(events) > 3 for events in got.values()), 30, 0.05)
    finally:
        rc = stop_and_check(srv, signal.SIGINT, timeout=30)
    log = srv.log()
    assert rc == 0, log[-3000:]
    assert "cancelled 1 background response(s)" in log and "Traceback" not in log, log[-3000:]
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert got[None][-1]["type"] == "response.cancelled" and got[1] == got[None][2:]


def _long_background_stream(srv: Server, **fields) -> httpx.Response:
    body = {**{k: v for k, v in LONG.items() if k != "extra_body"}, **LONG["extra_body"], "background": True,
            "stream": True, **fields}
    return httpx.stream("POST", srv.url + "/v1/responses", json=body, timeout=60)


def test_leaving_a_background_stream_leaves_the_response_running(long_server: Server) -> None:
    # Unlike a plain stream's, the client leaving does not cancel it: it ends as it would
    # have, and GET ?stream=true&starting_after= picks the events up where the client left.
    client = long_server.client()
    seen: list[dict] = []
    with _long_background_stream(long_server, max_output_tokens=1500) as resp:
        assert resp.status_code == 200
        for event in _events(resp):
            seen.append(event)
            if sum(e["type"] == "response.output_text.delta" for e in seen) == 3:
                break  # leaving the block closes the connection mid-stream
    response_id = seen[0]["response"]["id"]
    assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
    with client.responses.retrieve(response_id, stream=True, starting_after=seen[-1]["sequence_number"]) as rest:
        rest = list(rest)
    assert rest[0].sequence_number == len(seen) and rest[-1].type == "response.incomplete"
    done = client.responses.retrieve(response_id)
    assert done.status == "incomplete" and done.usage.output_tokens == 1500
    text = "".join(e["delta"] for e in seen if e["type"] == "response.output_text.delta")
    text += "".join(e.delta for e in rest if e.type == "response.output_text.delta")
    assert text == done.output_text and rest[-1].response.model_dump() == done.model_dump()
    client.responses.delete(response_id)


def test_cancelling_a_background_stream_ends_it_cancelled(long_server: Server) -> None:
    client = long_server.client()
    with _long_background_stream(long_server) as resp:
        events = []
        for event in _events(resp):
            events.append(event)
            if sum(e["type"] == "response.output_text.delta" for e in events) == 3:
                cancelled = client.responses.cancel(events[0]["response"]["id"])
    assert cancelled.status == "cancelled" and wait_until(lambda: _running(long_server) == 0, 10, 0.05)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    last = events[-1]
    assert last["type"] == "response.cancelled" and last["response"]["status"] == "cancelled"
    assert last["response"] == httpx.get(f"{long_server.url}/v1/responses/{cancelled.id}", timeout=30).json()
    with httpx.stream("GET", f"{long_server.url}/v1/responses/{cancelled.id}?stream=true", timeout=30) as replay:
        assert list(_events(replay)) == events


@pytest.fixture(scope="module")
def small_store_server(long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that stores 3 responses and runs 2 requests at a time, with xgrammar
    (whose compiler refuses in the engine core a grammar the API server's check passes)."""
    srv = start_server(long_model, tmp_path_factory.mktemp("responses-small-store"), "--served-model-name", "tiny",
                       "--max-model-len", "16384", "--max-num-seqs", "2",
                       "--structured-outputs-config", json.dumps({"backend": "xgrammar"}),
                       env_extra={"FORKLESS_RESPONSES_STORE_SIZE": "3"})
    yield srv
    assert stop_and_check(srv) == 0, srv.log()[-3000:]


def test_a_running_background_response_is_never_dropped_from_the_store(small_store_server: Server) -> None:
    # It used to be dropped as the oldest past FORKLESS_RESPONSES_STORE_SIZE, its result lost.
    srv = small_store_server
    client = srv.client()
    first = _started_in_background(srv)
    for _ in range(4):
        client.responses.create(model="tiny", input="Hi", max_output_tokens=1)
    assert client.responses.retrieve(first).status == "in_progress"
    second = client.responses.create(background=True, **LONG).id
    # The store holds 3, all of them running (the third waits for room in the engine): a
    # fourth is a 429, until one has ended.
    third = client.responses.create(model="tiny", input="Hi", max_output_tokens=20, background=True)
    with pytest.raises(openai.RateLimitError) as info:
        client.responses.create(background=True, **LONG)
    assert info.value.body["param"] == "background" and "FORKLESS_RESPONSES_STORE_SIZE" in info.value.message
    client.responses.cancel(first)
    fourth = client.responses.create(background=True, model="tiny", input="Hi", max_output_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first)  # the oldest that has ended made room
    for response_id in (second, third.id, fourth.id):
        client.responses.delete(response_id)
    assert wait_until(lambda: _running(srv) == 0, 10, 0.05)


def test_a_constrained_background_response_answers_at_once(small_store_server: Server) -> None:
    # It waited for its first token before answering (behind every request running), and
    # a grammar the engine core refused was a 400 instead of a failed response.
    srv = small_store_server
    client = srv.client()
    running = [_started_in_background(srv), client.responses.create(background=True, **LONG).id]
    assert wait_until(lambda: _running(srv) == 2, 60, 0.05)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    waiting = httpx.post(srv.url + "/v1/responses", timeout=20, json={
        "model": "tiny", "input": "Hi", "max_output_tokens": 20, "background": True,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}})
    assert waiting.status_code == 200 and waiting.json()["status"] == "queued", waiting.text
    client.responses.delete(waiting.json()["id"])
    for response_id in running:
        client.responses.delete(response_id)
    refused = client.responses.create(model="tiny", input="Say a.", max_output_tokens=2, background=True,
                                      extra_body={"structured_outputs": {"grammar": 'root ::= "a" | '}})
    assert refused.status == "queued"
    events = list(client.responses.retrieve(refused.id, stream=True))
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    failed = client.responses.retrieve(refused.id)
    assert failed.status == "failed" and "xgrammar" in failed.error.message
    assert events[-1].response.model_dump() == failed.model_dump()


def test_truncation_auto_drops_the_oldest_items_and_keeps_the_instructions(server: Server) -> None:
    # OpenAI's "auto": items are dropped from the start of the conversation until it fits;
    # "disabled" (the default) is a 400 for a conversation longer than the context.
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "word " * 30}
             for i in range(12)] + [{"role": "user", "content": "the last question"}]
    body = {"model": "tiny", "input": turns, "instructions": "Be brief.", "max_output_tokens": 8}
    too_long = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "input", too_long.text
    r = httpx.post(server.url + "/v1/responses", json={**body, "truncation": "auto"}, timeout=60)
    assert r.status_code == 200 and r.json()["truncation"] == "auto", r.text
    used = r.json()["usage"]["input_tokens"]
    assert used + 8 <= 256  # the tiny model's context
    # The kept items are the newest ones, after the instructions: the same prompt as the
    # conversation's tail sent on its own (bisection keeps as many as fit).
    kept = next(k for k in range(1, len(turns) + 1)
                if httpx.post(server.url + "/tokenize", json={"model": "tiny", "messages": [
                    {"role": "system", "content": "Be brief."}, *turns[-k:]]}, timeout=60).json()["count"] > used) - 1
    tail = httpx.post(server.url + "/tokenize", json={"model": "tiny", "messages": [
        {"role": "system", "content": "Be brief."}, *turns[-kept:]], "add_generation_prompt": True}, timeout=60)
    assert tail.json()["count"] == used and 1 <= kept < len(turns)
