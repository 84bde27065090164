"""Structured outputs through the OpenAI server and the official ``openai`` client, on
the default model, one server per backend (xgrammar's with async scheduling): ``response_format``, vLLM's
``structured_outputs`` field, ``tool_choice`` ``"required"`` and named, streaming, and
bad constraints (400, and the server keeps serving)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import openai
import pytest

from tests.server.conftest import Server, start_server, stop_and_check
from tests.structured_output.schemas import (
    CHOICES,
    EBNF,
    LARK,
    PROMPTS,
    REGEX,
    SCHEMAS,
    TIME_TOOL,
    WEATHER_TOOL,
)

pytestmark = pytest.mark.slow


# The xgrammar server also runs --async-scheduling: its constrained steps sample deferred
# (the grammars advance while the next forward runs); the guidance one steps synchronously.
@pytest.fixture(scope="module", params=[("xgrammar", True), ("guidance", False)], ids=["xgrammar-async", "guidance"])
def server(request: pytest.FixtureRequest, smollm2_folder: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    backend, async_steps = request.param
    srv = start_server(smollm2_folder, tmp_path_factory.mktemp("so-server"), "--served-model-name", "smol",
                       "--max-model-len", "1024", "--kv-cache-memory", str(256 << 20),
                       "--structured-outputs-config", json.dumps({"backend": backend}),
                       *(["--async-scheduling"] if async_steps else []))
    srv.extra["backend"] = backend
    yield srv
    assert stop_and_check(srv) == 0, srv.log()[-3000:]


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _gather(*coros: Any) -> list[Any]:
    async def run() -> list[Any]:
        return await asyncio.gather(*coros)

    return asyncio.run(run())


def test_response_format_json_schema_greedy_and_sampled(server: Server) -> None:
    client = server.async_client()
    cases = [(name, t) for name in ("person", "nested", "any_of") for t in (0.0, 0.9)]
    replies = _gather(*(client.chat.completions.create(
        model="smol", messages=_user(PROMPTS[name]), temperature=t, seed=5 if t else None, max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name],
                                                                 "strict": True}})
        for name, t in cases))
    for (name, t), reply in zip(cases, replies):
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", (name, t, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])


def test_streaming_gives_the_same_text(server: Server) -> None:
    client = server.client()
    kwargs: dict[str, Any] = dict(model="smol", messages=_user(PROMPTS["array"]), temperature=0, max_tokens=80,
                                  response_format={"type": "json_schema",
                                                   "json_schema": {"name": "colors", "schema": SCHEMAS["array"]}})
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                       if c.choices)
    assert streamed == whole
    jsonschema.validate(json.loads(whole), SCHEMAS["array"])


def test_structured_outputs_field_regex_choice_grammar_json_object(server: Server) -> None:
    client = server.async_client()
    grammar = EBNF if server.extra["backend"] == "xgrammar" else LARK
    prompt = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    completions = [
        ("Give me a phone number.", {"regex": REGEX}, lambda t: re.fullmatch(REGEX, t)),
        ("What is the capital of France?", {"choice": CHOICES}, lambda t: t in CHOICES),
        ("Is the sky blue?", {"grammar": grammar}, lambda t: re.fullmatch(r"The answer is (yes|no)\.", t)),
    ]
    replies = _gather(
        *(client.completions.create(model="smol", prompt=prompt.format(q), max_tokens=40, temperature=t,
                                    extra_body={"structured_outputs": so})
          for q, so, _ in completions for t in (0.0, 1.0)),
        client.chat.completions.create(model="smol", messages=_user(PROMPTS["nested"]), max_tokens=120, temperature=0,
                                       extra_body={"structured_outputs": {"json": SCHEMAS["nested"]}}),
        client.chat.completions.create(model="smol", messages=_user(PROMPTS["person"]), max_tokens=80, temperature=0,
                                       response_format={"type": "json_object"}))
    for i, reply in enumerate(replies[:6]):
        text = reply.choices[0].text
        assert reply.choices[0].finish_reason == "stop" and completions[i // 2][2](text), (i, text)
    jsonschema.validate(json.loads(replies[6].choices[0].message.content), SCHEMAS["nested"])
    assert isinstance(json.loads(replies[7].choices[0].message.content), dict)


def _check_calls(calls: list[Any], tools: list[dict]) -> None:
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])


def test_tool_choice_required_and_named(server: Server) -> None:
    client = server.async_client()
    tools = [WEATHER_TOOL, TIME_TOOL]
    question = _user("What's the weather like in Paris?")
    named = {"type": "function", "function": {"name": "get_time"}}
    required, by_name = _gather(
        client.chat.completions.create(model="smol", messages=question, tools=tools, tool_choice="required",
                                       max_tokens=120, temperature=0),
        client.chat.completions.create(model="smol", messages=question, tools=tools, tool_choice=named,
                                       max_tokens=60, temperature=0))
    # OpenAI's (and vLLM's) finish reasons: "tool_calls" for required, "stop" for a named function.
    for reply, finish in ((required, "tool_calls"), (by_name, "stop")):
        assert reply.choices[0].finish_reason == finish, reply
        _check_calls(reply.choices[0].message.tool_calls, tools)
    assert [c.function.name for c in by_name.choices[0].message.tool_calls] == ["get_time"]
    # Streamed, the named call's arguments add up to the same JSON.
    stream = server.client().chat.completions.create(model="smol", messages=question, tools=tools, tool_choice=named,
                                                     max_tokens=60, temperature=0, stream=True)
    names, arguments, finish = [], "", None
    for chunk in stream:
        for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if delta_call.function.name:
                names.append(delta_call.function.name)
            arguments += delta_call.function.arguments or ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert names == ["get_time"] and finish == "stop"
    assert arguments == by_name.choices[0].message.tool_calls[0].function.arguments
    # "required" streams each call as it is written (its name, then its arguments in
    # pieces), adding up to the unstreamed calls.
    stream = server.client().chat.completions.create(model="smol", messages=question, tools=tools,
                                                     tool_choice="required", max_tokens=120, temperature=0, stream=True)
    calls: dict[int, list] = {}
    for chunk in stream:
        for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if delta_call.index not in calls:
                assert delta_call.id and delta_call.type == "function" and delta_call.function.name
                calls[delta_call.index] = [delta_call.function.name, delta_call.function.arguments or "", 0]
            else:
                assert delta_call.id is None and delta_call.function.name is None
                calls[delta_call.index][1] += delta_call.function.arguments or ""
                calls[delta_call.index][2] += 1
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls"
    assert [(name, args) for name, args, _ in calls.values()] == \
        [(c.function.name, c.function.arguments) for c in required.choices[0].message.tool_calls]
    assert calls[0][2] > 1  # the arguments came in pieces


@pytest.mark.parametrize(("body", "message"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}}, "strin"),
    ({"structured_outputs": {"regex": "[0-9"}}, "regex"),
    ({"structured_outputs": {"grammar": "root ::= nothing_here"}}, "nothing_here"),
    ({"structured_outputs": {"json": '{"type": "object"'}}, "not valid JSON"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one of"),
    ({"structured_outputs": {"regexp": "a"}}, "regexp"),
    ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}}, "not both"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "uniqueItems": True}}}}, "uniqueItems"),
])
def test_bad_constraints_are_400_and_the_server_keeps_serving(server: Server, body: dict, message: str) -> None:
    client = server.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smol", messages=_user("Hi"), max_tokens=5, extra_body=body)
    assert message in str(info.value)
    assert client.chat.completions.create(model="smol", messages=_user("Hi"), max_tokens=3).choices[0].message


def test_a_grammar_xgrammar_cannot_compile_is_refused_naming_the_field_or_served_by_guidance(server: Server) -> None:
    """The API server's check reads EBNF with llguidance, which passes an empty alternative
    that xgrammar's compiler refuses in the engine core: with the xgrammar backend the
    refusal is a 400 naming structured_outputs, streamed or not (a stream waits for the
    compiled grammar's first token before its 200 starts), and the server keeps serving;
    with guidance (and with auto, the default, which falls back to it) the grammar is served."""
    import httpx

    fields = {"model": "smol", "max_tokens": 2, "structured_outputs": {"grammar": 'root ::= "a" | '}}
    replies = {
        (path, stream): httpx.post(server.url + path, json={**body, "stream": stream, **fields}, timeout=60)
        for path, body in (("/v1/chat/completions", {"messages": _user("Say a.")}),
                           ("/v1/completions", {"prompt": "Say a.", "n": 2}))
        for stream in (False, True)}
    for (path, stream), reply in replies.items():
        if server.extra["backend"] == "xgrammar":
            assert reply.status_code == 400, (path, stream, reply.text)
            assert reply.headers["content-type"].startswith("application/json"), (path, stream)
            error = reply.json()["error"]
            assert error["param"] == "structured_outputs" and "xgrammar" in error["message"], (path, stream, error)
        else:
            assert reply.status_code == 200, (path, stream, reply.text)
            if not stream:
                body = reply.json()["choices"]
                texts = [c["message"]["content"] if "message" in c else c["text"] for c in body]
            else:
                events = [line[len("data: "):] for line in reply.text.splitlines() if line.startswith("data: ")]
                assert events[-1] == "[DONE]", events
                chunks = [c for e in events[:-1] for c in json.loads(e)["choices"]]
                texts = ["".join(c.get("text") or (c.get("delta") or {}).get("content") or "" for c in chunks
                                 if c["index"] == i) for i in {c["index"] for c in chunks}]
            assert texts and all(t in ("a", "") for t in texts), (path, stream, texts)
    client = server.client()
    streamed = client.completions.create(model="smol", prompt="Say a.", max_tokens=3, stream=True,
                                         extra_body={"structured_outputs": {"regex": "a+"}})
    assert re.fullmatch("a*", "".join(c.choices[0].text for c in streamed if c.choices))
