"""``use_beam_search`` on /v1/completions and /v1/chat/completions (vLLM's extension): the
n best beams, the same as ``LLM.beam_search`` offline, streamed or not; and the fields
beam search cannot honour are refused."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from forkless import LLM
from forkless.sampling_params import BeamSearchParams
from tests.server.conftest import Server

PROMPT = "The capital of France is"


def _post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=120)


@pytest.fixture(scope="module")
def offline(tiny_llama: Path) -> list[str]:
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory=1 << 23)
    try:
        out = llm.beam_search([PROMPT], BeamSearchParams(beam_width=3, max_tokens=4, ignore_eos=True,
                                                         temperature=0.0))
        # Offline text starts with the prompt (vLLM's); a completion's choice is what follows.
        tokenizer, prompt_len = llm.get_tokenizer(), len(out[0].sequences[0].tokens) - 4
        return [tokenizer.decode(s.tokens[prompt_len:], skip_special_tokens=True) for s in out[0].sequences]
    finally:
        llm.shutdown()


def test_completions_return_the_offline_beams(server: Server, offline: list[str]) -> None:
    body = {"prompt": PROMPT, "n": 3, "max_tokens": 4, "ignore_eos": True, "temperature": 0,
            "use_beam_search": True}
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["text"] for c in choices] == offline and [c["index"] for c in choices] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in choices)
    assert r.json()["usage"]["completion_tokens"] == 12
    with httpx.stream("POST", server.url + "/v1/completions", json={"model": "tiny", **body, "stream": True},
                      timeout=120) as s:
        texts = ["", "", ""]
        for line in s.iter_lines():
            if line.startswith("data: {"):
                import json

                for c in json.loads(line[6:])["choices"]:
                    texts[c["index"]] += c["text"]
    assert texts == offline


def test_chat_with_beam_search_and_logprobs(server: Server) -> None:
    r = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 2,
                                               "max_tokens": 3, "ignore_eos": True, "use_beam_search": True,
                                               "logprobs": True, "top_logprobs": 4, "length_penalty": 0.5})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 2 and choices[0]["message"]["content"] != choices[1]["message"]["content"]
    for c in choices:
        content = c["logprobs"]["content"]
        assert len(content) == 3 and all(len(t["top_logprobs"]) == 4 for t in content)
    streamed = server.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=3, stream=True,
        extra_body={"ignore_eos": True, "use_beam_search": True, "length_penalty": 0.5})
    texts = ["", ""]
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c["message"]["content"] for c in choices]


@pytest.mark.parametrize(("route", "extra", "param"), [
    ("/v1/completions", {"top_p": 0.5}, "top_p"),
    ("/v1/completions", {"stop": ["x"]}, "stop"),
    ("/v1/completions", {"logprobs": 5}, "logprobs"),
    ("/v1/completions", {"n": 11}, None),
    ("/v1/completions", {"echo": True}, "echo"),
    ("/v1/completions", {"vllm_xargs": {"force_token_id": 42}}, "vllm_xargs"),
    ("/v1/chat/completions", {"extra_args": {"force_token_id": 42}}, "extra_args"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
     "tool_choice"),
])
def test_fields_beam_search_cannot_honour_are_refused(server: Server, route: str, extra: dict,
                                                      param: str | None) -> None:
    body = {"n": 2, "max_tokens": 2, "use_beam_search": True, **extra}
    body.update({"messages": [{"role": "user", "content": "Hi"}]} if "chat" in route else {"prompt": PROMPT})
    r = _post(server, route, body)
    assert r.status_code == 400, r.text
    if param is not None:
        assert r.json()["error"]["param"] == param
    else:
        assert "--max-logprobs" in r.json()["error"]["message"]


def test_length_penalty_without_beam_search_is_refused(server: Server) -> None:
    r = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "length_penalty": 0.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "length_penalty"
