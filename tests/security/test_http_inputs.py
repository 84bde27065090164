"""Inputs a client cannot mean are refused, every error has the OpenAI shape, and no
request takes the server down or stalls the others (issue "Nobody can take the server
down or stall everyone else"), through raw HTTP and the official ``openai`` client.

One server for the module, default flags, no API key.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from tests.server.conftest import Server, start_server, stop_and_check

SURROGATE = b"\\ud800"  # a JSON escape of a lone surrogate: valid JSON, not valid text
CHAT = '"messages": [{"role": "user", "content": "hi"}]'


@pytest.fixture(scope="module")
def srv(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tiny_llama, tmp_path_factory.mktemp("security-inputs"), "--served-model-name", "tiny")
    yield s
    assert stop_and_check(s) == 0, s.log()[-3000:]


def assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json", resp.headers
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status, error
    return error


def local_port(resp: httpx.Response) -> int:
    """The client-side port of the connection that carried ``resp``."""
    return resp.extensions["network_stream"].get_extra_info("client_addr")[1]


def post_raw(client: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return client.post(path, content=body, headers={"content-type": "application/json"}, timeout=60)


# -- 1. text that is not valid Unicode ------------------------------------------------

@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", b'{"model": "tiny", "prompt": "a' + SURROGATE + b'b", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"model": "tiny", "prompt": ["ok", "' + SURROGATE + b'"], "max_tokens": 2}', "prompt.1"),
    ("/v1/completions", b'{"model": "' + SURROGATE + b'", "prompt": "hi", "max_tokens": 2}', "model"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "stop": ["' + SURROGATE + b'"]}', "stop.0"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "logit_bias": {"' + SURROGATE + b'": 1}}', "logit_bias"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "h9_unknown": "' + SURROGATE + b'"}', "h9_unknown"),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "' + SURROGATE
     + b'"}], "max_tokens": 2}', "messages.0.content"),
    ("/v1/chat/completions", b'{"model": "' + SURROGATE + b'", ' + CHAT.encode() + b'}', "model"),
    ("/v1/chat/completions", b'{"model": "tiny", ' + CHAT.encode() + b', "tools": [{"type": "function", '
     b'"function": {"name": "f", "description": "' + SURROGATE + b'"}}]}', "tools.0.function.description"),
    ("/tokenize", b'{"prompt": "' + SURROGATE + b'"}', "prompt"),
    ("/tokenize", b'{"messages": [{"role": "user", "content": "x' + SURROGATE + b'"}]}', "messages.0.content"),
    ("/detokenize", b'{"model": "' + SURROGATE + b'", "tokens": [1]}', "model"),
])
def test_lone_surrogate_is_400_and_the_connection_stays_usable(srv: Server, path: str, body: bytes,
                                                                param: str) -> None:
    with httpx.Client(base_url=srv.url) as client:
        bad = post_raw(client, path, body)
        error = assert_openai_error(bad, 400)
        assert error["param"] == param and "lone surrogate" in error["message"], error
        good = post_raw(client, "/tokenize", b'{"prompt": "still here"}')
        assert good.status_code == 200, good.text
        assert local_port(good) == local_port(bad)  # the same keep-alive connection


def test_lone_surrogate_through_the_official_client(srv: Server) -> None:
    # The client cannot encode a lone surrogate itself; its transport swaps one in for a
    # marker, as a client with a buggy JSON encoder would send it.
    class SwapMarker(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            body = request.read().replace(b"@LONE@", SURROGATE)
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            return super().handle_request(httpx.Request(request.method, request.url, headers=headers, content=body))

    client = srv.client(http_client=httpx.Client(transport=SwapMarker()))
    with pytest.raises(openai.BadRequestError, match="lone surrogate") as info:
        client.completions.create(model="tiny", prompt="@LONE@", max_tokens=2)
    assert info.value.param == "prompt"
    with pytest.raises(openai.BadRequestError, match="lone surrogate") as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "@LONE@"}])
    assert info.value.param == "messages.0.content"
    with pytest.raises(openai.BadRequestError, match="lone surrogate") as info:
        client.completions.create(model="@LONE@", prompt="hi", max_tokens=2)
    assert info.value.param == "model"
    assert client.completions.create(model="tiny", prompt="fine", max_tokens=2).usage.completion_tokens == 2


def test_invalid_utf8_and_too_deep_json_are_400(srv: Server) -> None:
    with httpx.Client(base_url=srv.url) as client:
        error = assert_openai_error(post_raw(client, "/v1/completions", b'{"model": "tiny", "prompt": "\xff"}'), 400)
        assert "not valid UTF-8" in error["message"]
        deep = b'{"model": "tiny", "prompt": "hi", "extra_args": {"k": ' + b"[" * 500 + b"]" * 500 + b"}}"
        error = assert_openai_error(post_raw(client, "/v1/completions", deep), 400)
        assert error["param"].startswith("extra_args.k.0") and "nested deeper" in error["message"]
        deeper = b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
        assert "nested too deeply" in assert_openai_error(post_raw(client, "/v1/completions", deeper), 400)["message"]
        assert post_raw(client, "/tokenize", b'{"prompt": "ok"}').status_code == 200


# -- 2. every error has the OpenAI shape ----------------------------------------------

@pytest.mark.parametrize(("method", "path", "body", "status", "error_type"), [
    ("GET", "/no/such/route", None, 404, "NotFoundError"),
    ("POST", "/v1/nothing", b"{}", 404, "NotFoundError"),
    ("DELETE", "/v1/completions", None, 405, "MethodNotAllowedError"),
    ("GET", "/v1/chat/completions", None, 405, "MethodNotAllowedError"),
    ("POST", "/v1/completions", b'{"model": "tiny", "prompt": ', 400, "BadRequestError"),
    ("POST", "/v1/completions", b'{"model": "tiny", "prompt": "hi", "n": "many"}', 400, "BadRequestError"),
    ("POST", "/v1/completions", b'[1, 2]', 400, "BadRequestError"),
    ("POST", "/v1/completions", b'null', 400, "BadRequestError"),
    ("POST", "/tokenize", b'"text"', 400, "BadRequestError"),
    ("POST", "/v1/chat/completions", b'{"model": "tiny", "messages": [{"content": 1}]}', 400, "BadRequestError"),
    ("POST", "/detokenize", b'{"tokens": ["a"]}', 400, "BadRequestError"),
])
def test_errors_have_the_openai_shape(srv: Server, method: str, path: str, body: bytes | None, status: int,
                                      error_type: str) -> None:
    resp = httpx.request(method, srv.url + path, content=body, headers={"content-type": "application/json"},
                         timeout=60)
    assert assert_openai_error(resp, status)["type"] == error_type
    if status == 405:
        assert resp.headers["allow"]


def test_wrong_type_names_the_field(srv: Server) -> None:
    error = assert_openai_error(httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": "hi",
                                                                             "max_tokens": "ten"}), 400)
    assert error["param"] == "max_tokens"


def test_unknown_model_is_404_model_not_found_even_when_huge(srv: Server) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        srv.client().completions.create(model="x" * 100_000, prompt="hi", max_tokens=2)
    assert info.value.code == "model_not_found" and info.value.param == "model"
    assert len(info.value.message) < 2000  # the name is quoted, not echoed whole


# -- 8. numbers a client cannot mean ----------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [
    ("temperature", b"NaN"), ("temperature", b"Infinity"), ("temperature", b"1e999"),
    ("top_p", b"NaN"), ("repetition_penalty", b"Infinity"), ("repetition_penalty", b"1e999"),
    ("presence_penalty", b"-Infinity"), ("frequency_penalty", b"NaN"), ("min_p", b"NaN"),
])
def test_non_finite_numbers_are_400_naming_the_field(srv: Server, field: str, value: bytes) -> None:
    body = b'{"model": "tiny", "prompt": "hi", "max_tokens": 2, "' + field.encode() + b'": ' + value + b"}"
    chat = b'{"model": "tiny", ' + CHAT.encode() + b', "' + field.encode() + b'": ' + value + b"}"
    with httpx.Client(base_url=srv.url) as client:
        assert assert_openai_error(post_raw(client, "/v1/completions", body), 400)["param"] == field
        assert assert_openai_error(post_raw(client, "/v1/chat/completions", chat), 400)["param"] == field


@pytest.mark.parametrize("bias", [100.5, -101, 1e6])
def test_logit_bias_outside_plus_minus_100_is_400(srv: Server, bias: float) -> None:
    with pytest.raises(openai.BadRequestError, match="100") as info:
        srv.client().completions.create(model="tiny", prompt="hi", max_tokens=2, logit_bias={"5": bias})
    assert info.value.param.startswith("logit_bias")
    ok = srv.client().completions.create(model="tiny", prompt="hi", max_tokens=2, logit_bias={"5": -100})
    assert ok.usage.completion_tokens == 2


def test_huge_numbers_from_the_official_client_are_400(srv: Server) -> None:
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as info:  # an int too large for a float
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=10 ** 400)
    assert info.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"repetition_penalty": 10 ** 400})
    assert info.value.param == "repetition_penalty"


def check_offsets(text: str, tokens: list[str], offsets: list[int]) -> None:
    """Every offset indexes into ``text`` where its token's text is."""
    assert len(tokens) == len(offsets)
    assert offsets == sorted(offsets) and all(0 <= o <= len(text) for o in offsets), (text, offsets)
    for token, offset in zip(tokens, offsets):
        if "\ufffd" not in token:  # a token inside a multi-byte character has no text of its own
            assert text[offset:offset + len(token)] == token, (text, token, offset)


ECHO_PROMPT = "héllo wörld, 日本語 😀 and plain words"


def test_echo_logprobs_offsets_index_into_the_text(srv: Server) -> None:
    r = srv.client().completions.create(model="tiny", prompt=ECHO_PROMPT, max_tokens=8, temperature=0,
                                        echo=True, logprobs=2)
    (choice,) = r.choices
    lp = choice.logprobs
    assert choice.text.startswith(ECHO_PROMPT)
    assert len(lp.tokens) == r.usage.prompt_tokens + r.usage.completion_tokens
    check_offsets(choice.text, lp.tokens, lp.text_offset)
    # The prompt's own logprobs: none for the first token, one for each after it.
    prompt_lps = lp.token_logprobs[: r.usage.prompt_tokens]
    assert prompt_lps[0] is None and all(isinstance(x, float) for x in prompt_lps[1:])
    assert lp.top_logprobs[0] is None and all(len(t) >= 1 for t in lp.top_logprobs[1:])
    # The generated part starts right after the prompt.
    assert lp.text_offset[r.usage.prompt_tokens] == len(ECHO_PROMPT)


@pytest.mark.parametrize("echo", [True, False])
def test_streamed_offsets_count_from_the_start_of_the_choice(srv: Server, echo: bool) -> None:
    text, tokens, offsets = "", [], []
    # Sampled (seeded): greedy output repeats one token, whose offsets would pass by chance.
    for chunk in srv.client().completions.create(model="tiny", prompt=ECHO_PROMPT, max_tokens=12, temperature=1.0,
                                                 seed=11, echo=echo, logprobs=0, stream=True,
                                                 extra_body={"ignore_eos": True, "skip_special_tokens": False}):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs:
                tokens += choice.logprobs.tokens
                offsets += choice.logprobs.text_offset
    assert len(tokens) >= 12 and text.startswith(ECHO_PROMPT) == echo
    assert len(set(tokens)) > 3, tokens
    check_offsets(text, tokens, offsets)


# -- 9. fields forkless does not support ----------------------------------------------

def test_a_malformed_response_format_is_400(srv: Server) -> None:
    client = srv.client()
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="response_format") as info:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2,
                                       response_format={"type": "json_schema"})
    assert info.value.param == "response_format"
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, response_format={"type": "text"})
    assert r.usage.completion_tokens == 2


def test_unknown_fields_are_refused_naming_them(srv: Server) -> None:
    # As the OpenAI API answers an argument it does not know: a 400 naming the field, on
    # every endpoint; a misspelt field is not ignored (max_token would run to the context's end).
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={"h9_first_unknown": 1})
    assert info.value.param == "h9_first_unknown" and "Unrecognized request argument" in info.value.message
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=messages, extra_body={"max_token": 2})
    assert info.value.param == "max_token" and "did you mean 'max_tokens'" in info.value.message
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]}),
                       ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 2})):
        r = httpx.post(srv.url + path, json={**body, "h9_unknown": {"a": 1}}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "h9_unknown", (path, r.text)
    # Known vLLM fields at their do-nothing values are accepted.
    r = client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={"use_beam_search": False})
    assert r.usage.completion_tokens == 2
    assert "h9_" not in srv.log()  # refused, not logged


# -- 4. one client does not stall the others ------------------------------------------

HUGE = "hello world, this is a long prompt. " * (5_000_000 // 36)  # ~5 MB: ~9 s to tokenize


def test_huge_text_is_refused_without_tokenizing_it(srv: Server) -> None:
    # A token covers at most the longest vocabulary entry's characters, so this much text
    # cannot fit the context: refused at once, where tokenizing it first held the one
    # tokenizer thread -- and every other request behind it -- for seconds.
    chat = [{"role": "user", "content": HUGE}]
    for path, body, param in [("/v1/completions", {"model": "tiny", "prompt": HUGE, "max_tokens": 2}, "prompt"),
                              ("/v1/completions", {"model": "tiny", "prompt": ["hi", HUGE]}, "prompt"),
                              ("/v1/chat/completions", {"model": "tiny", "messages": chat}, "messages"),
                              ("/tokenize", {"prompt": HUGE}, "prompt"),
                              ("/tokenize", {"messages": chat}, "messages"),
                              # Tools render with the messages: huge ones are named.
                              ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                        "tools": [{"type": "function", "function": {
                                                            "name": "f", "description": HUGE}}],
                                                        "tool_choice": "none"}, "tools")]:
        start = time.monotonic()
        resp = httpx.post(srv.url + path, json=body, timeout=60)
        seconds = time.monotonic() - start
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert (error["param"], error["type"], error["code"]) == (param, "BadRequestError",
                                                                  "context_length_exceeded"), error
        assert "maximum context length" in error["message"], error
        assert seconds < 3, (path, seconds)  # parsing 5 MB of JSON, not tokenizing it


def test_huge_text_with_truncation_keeps_its_last_tokens(srv: Server) -> None:
    # truncate_prompt_tokens keeps the last tokens; only the text's tail that holds them
    # is tokenized, and they are the tokens the whole text would have ended with.
    tail = httpx.post(srv.url + "/tokenize", json={"prompt": HUGE[-3600:]}, timeout=60).json()["tokens"]
    resp = httpx.post(srv.url + "/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": HUGE, "max_tokens": 1, "truncate_prompt_tokens": 6, "echo": True,
        "temperature": 0})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["prompt_tokens"] == 6
    expected = httpx.post(srv.url + "/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": tail[-6:], "max_tokens": 1, "echo": True, "temperature": 0}).json()
    assert body["choices"][0]["text"] == expected["choices"][0]["text"]
