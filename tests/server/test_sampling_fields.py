"""vLLM's sampling request fields over HTTP: each one takes effect, or is a 400 naming it.

The conversion itself (request -> ``SamplingParams``) is checked without a server; the
effects through a real ``forkless serve`` on the tiny Llama.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
import torch

from forkless.entrypoints.openai.errors import BadRequest
from forkless.entrypoints.openai.serving import to_sampling_params, truncate_prompt
from forkless.protocol.openai import ChatCompletionRequest, CompletionRequest
from tests.server.conftest import Server

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a color."}]


def _completion(**fields) -> CompletionRequest:
    return CompletionRequest(prompt=PROMPT, **fields)


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MESSAGES, **fields)


# -- the conversion, without a server -------------------------------------------------------

def test_every_sampling_field_reaches_sampling_params() -> None:
    req = _completion(n=2, temperature=0.5, top_p=0.9, top_k=7, min_p=0.1, seed=3, min_tokens=2,
                      stop=["x"], stop_token_ids=[4], ignore_eos=True, presence_penalty=0.5,
                      frequency_penalty=0.25, repetition_penalty=1.1, logit_bias={"5": 1.0},
                      skip_special_tokens=False, spaces_between_special_tokens=False,
                      include_stop_str_in_output=True, prompt_logprobs=2, allowed_token_ids=[1, 2],
                      bad_words=["foo"], best_of=2)
    p = to_sampling_params(req, 10, 3, 99)
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (2, 0.5, 0.9, 7, 0.1, 3)
    assert (p.max_tokens, p.min_tokens, p.stop, p.stop_token_ids, p.ignore_eos) == (10, 2, ["x"], [4], True)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, 0.25, 1.1)
    assert p.logit_bias == {5: 1.0} and p.logprobs == 3 and p.prompt_logprobs == 2
    assert not p.skip_special_tokens and not p.spaces_between_special_tokens and p.include_stop_str_in_output
    assert p.allowed_token_ids == [1, 2] and p.bad_words == ["foo"]


def test_echo_with_logprobs_asks_for_the_prompt_logprobs() -> None:
    assert to_sampling_params(_completion(echo=True, logprobs=2), 5, 2, 5).prompt_logprobs == 2
    assert to_sampling_params(_completion(echo=True), 5, None, 5).prompt_logprobs is None
    assert to_sampling_params(_completion(logprobs=2), 5, 2, 5).prompt_logprobs is None


@pytest.mark.parametrize(("req", "param"), [
    (_completion(prompt_logprobs=1, stream=True), "prompt_logprobs"),
    (_completion(prompt_logprobs=-2), "prompt_logprobs"),
    (_completion(allowed_token_ids=[]), "allowed_token_ids"),
    (_completion(bad_words=["ok", " "]), "bad_words"),
    (_completion(top_p=2.0), "top_p"),
    (_completion(best_of=3), "best_of"),
    (_completion(length_penalty=0.5), "length_penalty"),
    (_completion(response_format={"type": "json_schema"}), "response_format"),
    (_completion(structured_outputs={"regex": "a+", "choice": ["b"]}), "structured_outputs"),
    (_completion(guided_choice=["a", "b"]), "guided_choice"),
    (_completion(logprob_token_ids=[1]), "logprob_token_ids"),
    (_completion(prompt_logprob_token_ids=[1, 2]), "prompt_logprob_token_ids"),
    (_chat(prompt_logprob_start=3), "prompt_logprob_start"),
    (_completion(trace_decode_token_ids=[5, 6]), "trace_decode_token_ids"),
    (_chat(detokenize=False), "detokenize"),
    (_chat(return_prompt_text=True), "return_prompt_text"),
    (_completion(flat_logprobs="yes"), "flat_logprobs"),
    (_completion(add_special_tokens=False), "add_special_tokens"),
    (_chat(add_special_tokens=True), "add_special_tokens"),
    (_chat(prompt_logprobs=1, stream=True), "prompt_logprobs"),
    (_completion(stream_options={"include_usage": True}), "stream_options"),
    (_completion(max_completion_tokens=5), "max_completion_tokens"),
    (_chat(functions=[{"name": "f"}]), "functions"),
    (_chat(verbosity="low"), "verbosity"),
    (_chat(web_search_options={}), "web_search_options"),
    (_completion(logits_processors=["pkg.mod.Processor"]), "logits_processors"),
    (_chat(logits_processors=[{"qualname": "pkg.mod.Processor"}]), "logits_processors"),
    (_completion(min_tokens=3, structured_outputs={"choice": ["yes", "no"]}), "min_tokens"),
    (_completion(seed=2**70), "seed"),
    (_chat(stream=True, stream_interval=2**70), "stream_interval"),
    (_completion(stop=""), "stop"),
    # A token id has one spelling: int() would take these (and merge "5" with "05").
    (_completion(logit_bias={" 5": 1.0}), "logit_bias"),
    (_completion(logit_bias={"5": 1.0, "05": 2.0}), "logit_bias"),
    (_completion(logit_bias={"5_0": 1.0}), "logit_bias"),
    (_completion(logit_bias={"\u0665": 1.0}), "logit_bias"),
])
def test_fields_that_would_be_ignored_are_rejected_naming_them(req, param) -> None:
    with pytest.raises(BadRequest) as info:
        to_sampling_params(req, 5, None, 5)
    assert info.value.param == param and info.value.status == 400
    assert param in info.value.message


@pytest.mark.parametrize("req", [
    _completion(use_beam_search=False, length_penalty=1.0, best_of=1, response_format={"type": "text"},
                add_special_tokens=True, return_token_ids=False, thinking_token_budget=-1, session_id="s",
                some_future_openai_field=1, cache_salt="s", logits_processors=[], flat_logprobs=True,
                prompt_logprob_start=0, detokenize=True, return_token_offsets=True, return_mm_kwargs=False),
    _chat(add_special_tokens=False, echo=False, include_reasoning=True, flat_logprobs=False, session_id="s",
          return_prompt_text=False),
])
def test_vllm_fields_at_their_do_nothing_values_are_accepted(req) -> None:
    to_sampling_params(req, 5, None, 5)


def test_truncate_prompt_tokens_keeps_the_last_or_first_tokens() -> None:
    ids = list(range(10))
    assert truncate_prompt(ids, _completion(), 4, 100) == ids
    assert truncate_prompt(ids, _completion(truncate_prompt_tokens=3), 4, 100) == [7, 8, 9]
    assert truncate_prompt(ids, _completion(truncate_prompt_tokens=3, truncation_side="right"), 4, 100) == [0, 1, 2]
    assert truncate_prompt(ids, _completion(truncate_prompt_tokens=30), 4, 100) == ids
    assert truncate_prompt(ids, _completion(truncate_prompt_tokens=-1), 4, 8) == ids[-4:]  # 8 - max_tokens
    assert truncate_prompt(ids, _completion(truncate_prompt_tokens=-1), None, 8) == ids[-7:]  # room for one
    for bad in (0, 5):
        with pytest.raises(BadRequest) as info:
            truncate_prompt(ids, _completion(truncate_prompt_tokens=bad), 4, 8)
        assert info.value.param == "truncate_prompt_tokens"


# -- through the server -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_reference(tiny_llama: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return tok, logprobs


def _post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=60)


def _check_prompt_logprobs(entries: list, ids: list[int], ref: torch.Tensor, top: int) -> None:
    assert len(entries) == len(ids) and entries[0] is None
    for pos in range(1, len(ids)):
        entry = {int(k): v for k, v in entries[pos].items()}
        row = ref[pos - 1]
        assert set(entry) == {ids[pos], *row.topk(top).indices.tolist()}
        for tok_id, lp in entry.items():
            assert lp["logprob"] == pytest.approx(row[tok_id].item(), abs=1e-3)
            assert lp["rank"] >= 1 and isinstance(lp["decoded_token"], str)


def test_completion_prompt_logprobs_equal_transformers(server: Server, hf_reference) -> None:
    tok, logprobs = hf_reference
    r = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": 2, "n": 2,
                                          "temperature": 1.0, "seed": 1})
    assert r.status_code == 200, r.text
    ids = tok.encode(PROMPT)
    ref = logprobs(ids)
    choices = r.json()["choices"]
    assert len(choices) == 2
    for choice in choices:
        _check_prompt_logprobs(choice["prompt_logprobs"], ids, ref, 2)
    plain = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    assert plain.json()["choices"][0]["prompt_logprobs"] is None


def test_chat_prompt_logprobs_at_the_response_level(server: Server, hf_reference) -> None:
    _, logprobs = hf_reference
    tokens = _post(server, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    r = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "prompt_logprobs": 1})
    assert r.status_code == 200, r.text
    _check_prompt_logprobs(r.json()["prompt_logprobs"], tokens, logprobs(tokens), 1)


def test_echo_with_logprobs_covers_the_prompt_tokens(server: Server, hf_reference) -> None:
    tok, logprobs = hf_reference
    ids = tok.encode(PROMPT)
    client = server.client()
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 3 and r.choices[0].text.startswith(PROMPT)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ref = logprobs(ids)
    for pos in range(1, len(ids)):
        assert lp.token_logprobs[pos] == pytest.approx(ref[pos - 1, ids[pos]].item(), abs=1e-3)
    stream = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, echo=True,
                                       logprobs=1, stream=True)
    streamed = [t for chunk in stream for t in (chunk.choices[0].logprobs.tokens if chunk.choices[0].logprobs else [])]
    assert streamed == lp.tokens


def test_allowed_token_ids_restrict_the_text(server: Server, hf_reference) -> None:
    tok, _ = hf_reference
    allowed = tok.encode(" red green blue")
    r = server.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=5,
                                           logprobs=0, extra_body={"allowed_token_ids": allowed})
    texts = {tok.decode([t]) for t in allowed}
    assert set(r.choices[0].logprobs.tokens) <= texts
    with pytest.raises(openai.BadRequestError, match="allowed_token_ids"):
        server.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=2,
                                           extra_body={"allowed_token_ids": [10 ** 7]})


def test_bad_words_change_the_greedy_text(server: Server) -> None:
    client = server.client()
    free = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=0)
    first = free.choices[0].logprobs.tokens[0]
    assert first.strip(), "pick a prompt whose greedy first token is a word"
    banned = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=0,
                                       extra_body={"bad_words": [first]})
    assert banned.choices[0].logprobs.tokens[0] != first


def test_truncate_prompt_tokens_over_http(server: Server, hf_reference) -> None:
    tok, _ = hf_reference
    ids = tok.encode("one two three four five six seven eight nine ten")
    client = server.client()
    kw = dict(model="tiny", max_tokens=4, temperature=0)
    for side, kept in (("left", ids[-5:]), ("right", ids[:5])):
        r = client.completions.create(prompt=ids, extra_body={"truncate_prompt_tokens": 5, "truncation_side": side},
                                      **kw)
        assert r.usage.prompt_tokens == 5
        assert r.choices[0].text == client.completions.create(prompt=kept, **kw).choices[0].text
    chat = client.chat.completions.create(messages=MESSAGES, extra_body={"truncate_prompt_tokens": 3}, **kw)
    assert chat.usage.prompt_tokens == 3


def test_unsupported_fields_are_openai_style_400s(server: Server) -> None:
    for path, body, param in [
        ("/v1/completions", {"prompt": PROMPT, "best_of": 4}, "best_of"),
        ("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {"type": "json_schema"}},
         "response_format"),
        ("/v1/completions", {"prompt": PROMPT, "bad_words": [""]}, "bad_words"),
        ("/v1/completions", {"prompt": PROMPT, "request_id": ""}, "request_id"),
        ("/v1/completions", {"prompt": PROMPT, "stream_options": {"include_usage": True}}, "stream_options"),
        # No KV connector on this server: nothing would read them.
        ("/v1/chat/completions", {"messages": MESSAGES, "kv_transfer_params": {"do_remote_prefill": True}},
         "kv_transfer_params"),
        ("/v1/completions", {"prompt": PROMPT, "kv_transfer_params": "remote"}, "kv_transfer_params"),
    ]:
        r = _post(server, path, body)
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["type"] == "BadRequestError" and error["param"] == param and param in error["message"]


def test_vllm_engine_logprob_fields_are_honoured_or_refused_never_ignored(server: Server) -> None:
    """flat_logprobs picks how vLLM's engine holds logprobs in memory: either value gives
    the same JSON, and neither is logged as ignored. prompt_logprob_token_ids would score
    chosen tokens at each prompt position, which is not implemented: a 400 naming it."""
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 2, "prompt_logprobs": 1}
    plain = _post(server, "/v1/completions", body)
    for flat in (True, False):
        r = _post(server, "/v1/completions", {**body, "flat_logprobs": flat})
        assert r.status_code == 200, r.text
        for key in ("text", "logprobs", "prompt_logprobs"):
            assert r.json()["choices"][0][key] == plain.json()["choices"][0][key], key
    chat = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "logprobs": True,
                                                  "top_logprobs": 1, "flat_logprobs": True})
    assert chat.status_code == 200 and chat.json()["choices"][0]["logprobs"]["content"], chat.text
    for route, extra in (("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": MESSAGES})):
        r = _post(server, route, {**extra, "max_tokens": 2, "prompt_logprob_token_ids": [1, 2]})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "prompt_logprob_token_ids", r.text
    r = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "flat_logprobs": "yes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "flat_logprobs", r.text
    # A misspelt one is refused, naming it and the field it resembles.
    r = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "flat_logprobz": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "flat_logprobz", r.text
    assert "did you mean 'flat_logprobs'" in r.json()["error"]["message"], r.text


def test_vllm_fields_without_effect_are_typed_and_accepted(server: Server) -> None:
    """session_id, return_token_offsets and return_mm_kwargs change nothing on vLLM's
    generation endpoints, nor OpenAI's safety_identifier and prompt_cache_key here:
    accepted (a value of the wrong type is a 400), not refused as unknown; return_prompt_text,
    which would add the templated prompt to the answer, is a 400 naming it."""
    fields = {"session_id": "conversation-7", "return_token_offsets": True, "return_mm_kwargs": False,
              "safety_identifier": "user-hash-1", "prompt_cache_key": "tenant-3"}
    for route, extra in (("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": MESSAGES})):
        r = _post(server, route, {**extra, "max_tokens": 2, **fields})
        assert r.status_code == 200, r.text
        for name in ("session_id", "prompt_cache_key"):
            r = _post(server, route, {**extra, "max_tokens": 2, name: 7})
            assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text
    r = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "return_prompt_text": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_prompt_text", r.text


def test_unknown_stream_options_are_refused() -> None:
    with pytest.raises(ValueError, match="bogus"):
        _completion(stream=True, stream_options={"include_usage": True, "bogus": 1})


def test_completions_default_to_16_tokens_as_openai(server: Server) -> None:
    # Chat's default is what the context leaves; completions' is 16 (OpenAI's and vLLM's),
    # and an explicit null is 16 too (vLLM normalizes it).
    r = _post(server, "/v1/completions", {"prompt": PROMPT, "ignore_eos": True, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
    r = _post(server, "/v1/completions", {"prompt": PROMPT, "ignore_eos": True, "max_tokens": None,
                                          "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16


def test_continuous_usage_stats_put_usage_in_every_chunk(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    for create, kwargs in ((client.completions.create, {"prompt": PROMPT}),
                           (client.chat.completions.create, {"messages": MESSAGES})):
        chunks = list(create(model="tiny", max_tokens=6, temperature=0, stream=True, extra_body={"ignore_eos": True},
                             stream_options={"include_usage": True, "continuous_usage_stats": True}, **kwargs))
        counted = [c.usage.completion_tokens for c in chunks if c.choices and c.usage is not None]
        assert counted and counted == sorted(counted) and counted[-1] == 6
        assert all(c.usage is not None for c in chunks if c.choices and getattr(c.choices[0], "text", "x"))
        assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].usage.prompt_tokens > 0
        # continuous_usage_stats alone asks for nothing (vLLM's rule): no usage anywhere.
        plain = list(create(model="tiny", max_tokens=3, stream=True, stream_options={"continuous_usage_stats": True},
                            **kwargs))
        assert plain and all(c.usage is None for c in plain)


def test_chat_content_parts_and_a_tool_turn_with_null_content(server: Server) -> None:
    # What the OpenAI SDK sends: content as a list of parts; an assistant turn that only
    # called a tool, with content null; the tool's answer.
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    kw = dict(model="tiny", max_tokens=4, temperature=0)
    parts = client.chat.completions.create(
        messages=[{"role": "user", "content": [{"type": "text", "text": "Name a"}, {"type": "text", "text": "color."}]}],
        **kw)
    joined = client.chat.completions.create(messages=[{"role": "user", "content": "Name a\ncolor."}], **kw)
    assert parts.choices[0].message.content == joined.choices[0].message.content
    assert parts.usage.prompt_tokens == joined.usage.prompt_tokens
    turns = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    assert client.chat.completions.create(messages=turns, **kw).usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
            **kw)
    assert "messages[0].content[1] has type 'image_url'" in info.value.message


def test_tokenize_takes_the_chat_fields(server: Server) -> None:
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I am"}]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    chat = client.chat.completions.create(model="tiny", messages=turns, max_tokens=1,
                                          extra_body={"continue_final_message": True, "add_generation_prompt": False})
    r = _post(server, "/tokenize", {"messages": turns, "continue_final_message": True, "add_generation_prompt": False,
                                    "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == chat.usage.prompt_tokens == len(body["token_strs"])
    opened = _post(server, "/tokenize", {"messages": turns, "add_generation_prompt": False}).json()
    assert opened["count"] > body["count"]  # the closed turn adds its end-of-turn tokens
    both = _post(server, "/tokenize", {"messages": turns, "prompt": "Hi"})
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"
    # What chat completions refuse, /tokenize refuses with messages: its tokens would not follow it.
    for field, value in (("add_special_tokens", True), ("chat_template", "{{ 'X' }}"),
                         ("mm_processor_kwargs", {"a": 1})):
        refused = _post(server, "/tokenize", {"messages": turns, field: value})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == field, refused.text
    unnamed = _post(server, "/tokenize", {"messages": turns, "return_token_strs": None})  # null: false, as vLLM
    assert unnamed.status_code == 200 and unnamed.json()["token_strs"] is None, unnamed.text
    quiet = _post(server, "/tokenize", {"messages": turns, "add_generation_prompt": False, "add_special_tokens": False,
                                        "chat_template": None})
    assert quiet.status_code == 200 and quiet.json()["tokens"] == opened["tokens"]


def test_completions_logprobs_0_give_the_sampled_token_alone(server: Server) -> None:
    # As vLLM: logprobs=0 returns each sampled token's own logprob as its one top entry.
    r = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 0})
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["top_logprobs"] == [{t: v} for t, v in zip(lp["tokens"], lp["token_logprobs"])]
    chat = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "logprobs": True,
                                                  "top_logprobs": 21})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "top_logprobs"


@pytest.mark.parametrize(("route", "field", "value"), [
    ("/v1/completions", "logprobs", 21), ("/v1/completions", "logprobs", -1),
    ("/v1/completions", "logprobs", -2), ("/v1/completions", "prompt_logprobs", 21),
    ("/v1/chat/completions", "top_logprobs", -1), ("/v1/chat/completions", "top_logprobs", -3),
])
def test_logprobs_beyond_max_logprobs_are_refused(server: Server, route: str, field: str, value: int) -> None:
    # vLLM's --max-logprobs defaults to 20; -1 (the whole vocabulary) is over it too.
    body = {"max_tokens": 2, field: value}
    body.update({"messages": MESSAGES, "logprobs": True} if "chat" in route else {"prompt": PROMPT})
    r = _post(server, route, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert ("--max-logprobs" if value >= -1 else "-1 for the whole vocabulary") in r.json()["error"]["message"]


def test_null_n_and_stream_are_their_defaults() -> None:
    # The OpenAI API declares both nullable; some clients send null.
    for req in (_completion(n=None, stream=None), _chat(n=None, stream=None)):
        assert (req.n, req.stream) == (1, False)
        assert to_sampling_params(req, 5, None, 5).n == 1
    # So are completions' echo and chat's logprobs (false, as in vLLM).
    assert _completion(echo=None).echo is False and _chat(logprobs=None).logprobs is False


def test_echo_with_max_tokens_0_returns_the_prompt_alone(server: Server) -> None:
    # vLLM's echo without generation (scoring harnesses send it): the prompt, its logprobs, nothing generated.
    body = {"prompt": PROMPT, "echo": True, "max_tokens": 0, "logprobs": 1}
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    assert choice["text"] == PROMPT and usage["completion_tokens"] == 0
    assert len(choice["logprobs"]["tokens"]) == usage["prompt_tokens"]
    assert choice["logprobs"]["token_logprobs"][0] is None and None not in choice["logprobs"]["token_logprobs"][1:]
    streamed = "".join(c.text for c in server.client().completions.create(
        model="tiny", prompt=PROMPT, echo=True, max_tokens=0, stream=True) for c in c.choices)
    assert streamed == PROMPT


def test_x_request_id_names_the_response(server: Server) -> None:
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 1,
                                                           "request_id": "body-id"},
                   headers={"X-Request-Id": "from-header"}, timeout=60)
    assert r.json()["id"] == "cmpl-from-header"  # the header wins over the body, as in vLLM
    chat = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES,
                                                                  "max_tokens": 1},
                      headers={"X-Request-Id": "abc"}, timeout=60)
    assert chat.json()["id"] == "chatcmpl-abc"


def test_chat_template_switches(server: Server) -> None:
    both = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1,
                                                  "continue_final_message": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    ok = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1,
                                                "continue_final_message": True, "add_generation_prompt": False})
    assert ok.status_code == 200
    # chat_template_kwargs override the request's own template arguments, as vLLM lets them.
    plain = _post(server, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()["count"]
    by_kwargs = _post(server, "/tokenize", {"messages": MESSAGES,
                                            "chat_template_kwargs": {"add_generation_prompt": False}}).json()
    assert by_kwargs["count"] == plain
    assert _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 0,
                                             "stream": True}).status_code == 200
    assert _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "model": ""}).status_code == 200


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/completions", {"prompt": PROMPT, "stop_token_ids": [10 ** 6]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": [10 ** 6]}, "prompt"),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}}, "response_format"),
    ("/v1/chat/completions", {"messages": MESSAGES, "modalities": ["audio"]}, "modalities"),
    ("/v1/completions", {"prompt": PROMPT, "early_stopping": True}, "early_stopping"),
    ("/v1/completions", {"prompt": PROMPT, "use_beam_search": True, "n": 2, "best_of": 5}, "best_of"),
    ("/v1/completions", {"prompt": PROMPT, "use_beam_search": True, "n": 2,
                         "stream_options": {"include_usage": True}}, "stream_options"),
    # An integer msgpack cannot carry to the engine core, in a schema: a 400, not a 500.
    ("/v1/completions", {"prompt": PROMPT, "structured_outputs": {"json": {"const": 10 ** 30}}},
     "structured_outputs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "maximum": 10 ** 30}}}},
     "response_format"),
    ("/v1/chat/completions", {"messages": MESSAGES, "chat_template_kwargs": {"return_dict": True}},
     "chat_template_kwargs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "f", "x": 1}}}, "tool_choice"),
    ("/v1/responses", {"input": "Hi", "top_logprobs": 21}, "top_logprobs"),
    # Values of their JSON types, as OpenAI's API checks them (pydantic would convert these).
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": "4"}, "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"messages": MESSAGES, "n": True}, "n"),
    ("/v1/chat/completions", {"messages": MESSAGES, "temperature": "0.5"}, "temperature"),
])
def test_refusals_name_the_field_the_client_sent(server: Server, route: str, body: dict, param: str) -> None:
    r = _post(server, route, {"max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_streamed_text_offsets_match_the_whole_answer_under_a_stop_string(server: Server) -> None:
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    text = _post(server, "/v1/completions", body).json()["choices"][0]["text"]
    stop = text[len(text) // 2: len(text) // 2 + 3]
    whole = _post(server, "/v1/completions", {**body, "stop": [stop]}).json()["choices"][0]
    offsets, tokens, streamed = [], [], ""
    for chunk in server.client().completions.create(model="tiny", stream=True, stop=[stop], prompt=PROMPT,
                                                    max_tokens=12, temperature=0, logprobs=1,
                                                    extra_body={"ignore_eos": True}):
        for c in chunk.choices:
            streamed += c.text
            if c.logprobs is not None:
                offsets += c.logprobs.text_offset
                tokens += c.logprobs.tokens
    assert streamed == whole["text"]
    assert (offsets, tokens) == (whole["logprobs"]["text_offset"], whole["logprobs"]["tokens"])


def test_a_grammar_xgrammar_cannot_compile_is_served_by_the_default_auto_backend(server: Server) -> None:
    # llguidance's check passes an empty alternative that xgrammar's compiler refuses in the
    # engine core; auto (the default, as vLLM's) then compiles it with guidance.
    fields = {"max_tokens": 2, "structured_outputs": {"grammar": 'root ::= "a" | '}}
    r = _post(server, "/v1/chat/completions", {"messages": MESSAGES, **fields})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("a", ""), r.text
