"""Bad requests get HTTP 400 (an unknown model 404) with an OpenAI-style body, and the
server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import Server


def assert_openai_error(resp: httpx.Response, status: int = 400, fragment: str = "") -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert fragment in err["message"]
    return err


@pytest.mark.parametrize(
    ("path", "body", "fragment", "param"),
    [
        # SamplingParams errors name their field in param
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "temperature": -1}, "temperature", "temperature"),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "top_p": 1.5}, "top_p", "top_p"),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 0}, "max_tokens", "max_tokens"),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "n": 0}, "n", "n"),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "min_p": 2}, "min_p", "min_p"),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "top_k": -5}, "top_k", "top_k"),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "repetition_penalty": 0}, "repetition_penalty",
         "repetition_penalty"),
        ("/v1/completions", {"model": "tiny", "prompt": "word " * 400}, "maximum context length is 256", "prompt"),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1000}, "maximum context length", "max_tokens"),
        ("/v1/completions", {"model": "tiny", "prompt": ""}, "empty", "prompt"),
        ("/v1/completions", {"model": "tiny"}, "prompt", "prompt"),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "logprobs": 50}, "logprobs", "logprobs"),
        # found by schemathesis: these were a 500 and a denial of service
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "seed": 2**70}, "64-bit", None),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "vllm_xargs": {"k": -2**70}}, "64-bit", None),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "n": 100_000}, "128", "n"),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "top_k": 2**70}, "64-bit", "top_k"),
        # a string where a flag is a boolean once killed the engine core (its typed decoding)
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "structured_outputs": {
            "regex": "a", "disable_any_whitespace": "maybe"}}, "expected true or false", "structured_outputs"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "word " * 400}]},
         "maximum context length is 256", "messages"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": []},
         "empty array", "tools"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                  "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
         "name", "response_format.json_schema.name"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                  "response_format": {"type": "text", "json_schema": {"name": "x"}}},
         'type "text"', "response_format"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                  "response_format": {"type": "json_object", "strict": True}},
         "strict", "response_format.strict"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                  "stream": True, "stream_options": {"include_obfuscation": True}},
         "obfuscat", "stream_options.include_obfuscation"),
        ("/v1/chat/completions", {"model": "tiny", "messages": []}, "messages must not be empty", "messages"),
        ("/v1/chat/completions", {"model": "tiny", "messages": "hi"}, "messages", "messages"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                  "presence_penalty": 5}, "presence_penalty", "presence_penalty"),
    ],
)
def test_bad_requests_are_400(server: Server, path: str, body: dict, fragment: str, param: str | None) -> None:
    err = assert_openai_error(httpx.post(server.url + path, json=body, timeout=30), 400, fragment)
    if param is not None:
        assert err["param"] == param


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_unknown_model_is_404_model_not_found(server: Server, path: str, stream: bool) -> None:
    body = {"model": "nope", "stream": stream, "max_tokens": 2}
    body.update({"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]})
    err = assert_openai_error(httpx.post(server.url + path, json=body, timeout=30), 404, "`nope` does not exist")
    assert err == {"message": err["message"], "type": "NotFoundError", "param": "model", "code": "model_not_found"}
    assert "tiny" in err["message"]  # names what the server does serve


@pytest.mark.parametrize("stream", [False, True])
def test_client_sees_not_found_error_for_unknown_model(server: Server, stream: bool) -> None:
    client = server.client()
    with pytest.raises(openai.NotFoundError, match="`nope` does not exist") as info:
        client.completions.create(model="nope", prompt="hi", max_tokens=2, stream=stream)
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found" and info.value.param == "model"
    with pytest.raises(openai.NotFoundError, match="`nope` does not exist"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, stream=stream)


def test_malformed_json_is_400_and_server_keeps_serving(server: Server) -> None:
    resp = httpx.post(server.url + "/v1/completions", content=b'{"model": "tiny", "prompt": ',
                      headers={"content-type": "application/json"})
    assert_openai_error(resp, 400, "JSON")
    r = server.client().completions.create(model="tiny", prompt="still alive", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens == 2


def test_client_sees_bad_request_error(server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="temperature"):
        server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                temperature=-0.5)


def test_streaming_bad_request_is_400_before_streaming(server: Server) -> None:
    with httpx.stream("POST", server.url + "/v1/completions",
                      json={"model": "tiny", "prompt": "hi", "stream": True, "top_p": 0}) as resp:
        resp.read()
        assert_openai_error(resp, 400, "top_p")
