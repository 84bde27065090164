"""The OpenAI API of a real ``forkless serve`` process, through the official client."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.server.conftest import Server

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "Hello, my name is"]


def test_models_health_version(server: Server) -> None:
    client = server.client()
    (model,) = client.models.list().data
    assert model.id == "tiny"
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/version").json()["version"] == "0.1.0"


def test_sagemaker_ping_and_invocations(server: Server) -> None:
    # vLLM's SageMaker routes: /ping answers as /health; /invocations serves a body by the
    # request type it validates as (chat first, then completions).
    assert [httpx.request(m, server.url + "/ping").status_code for m in ("GET", "POST")] == [200, 200]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
    direct = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).json()
    invoked = httpx.post(server.url + "/invocations", json=chat, timeout=60).json()
    assert invoked["object"] == "chat.completion"
    assert invoked["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    completion = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 3, "temperature": 0}
    invoked = httpx.post(server.url + "/invocations", json=completion, timeout=60).json()
    assert invoked["object"] == "text_completion"
    assert invoked["choices"][0]["text"] == httpx.post(server.url + "/v1/completions", json=completion,
                                                       timeout=60).json()["choices"][0]["text"]
    with httpx.stream("POST", server.url + "/invocations", json={**completion, "stream": True}, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and events[0].startswith("data: {")
    expected = "a chat completion request (with messages), a completion request (with prompt)"
    for body, fragment in (({"model": "tiny", "input": "hi"}, expected),
                           ([1, 2], "JSON object"), (None, "not valid JSON")):
        r = httpx.post(server.url + "/invocations", content=b"{" if body is None else None,
                       json=body if body is not None else None, timeout=60)
        assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text


def test_logprobs_of_tokens_a_grammar_masks_are_numbers(server: Server) -> None:
    # A grammar masks tokens to -inf, and they still rank among the top ones: JSON cannot
    # carry -inf (it was a 500), so they are -9999.0, as vLLM answers.
    import json
    import math

    constraint = {"structured_outputs": {"regex": "[0-9]{4}"}}
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "Num:", "max_tokens": 6,
                                                        "logprobs": 3, **constraint}, timeout=60)
    assert r.status_code == 200, r.text
    tops = r.json()["choices"][0]["logprobs"]["top_logprobs"]
    values = [v for top in tops for v in top.values()]
    assert -9999.0 in values and all(isinstance(v, float) and math.isfinite(v) for v in values), tops
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Num?"}], "max_tokens": 6, "logprobs": True,
            "top_logprobs": 3, **constraint}
    for stream in (False, True):
        r = httpx.post(server.url + "/v1/chat/completions", json={**chat, "stream": stream}, timeout=60)
        assert r.status_code == 200, r.text
        bodies = ([json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")] if stream
                  else [r.json()])
        content = [c for b in bodies for ch in b["choices"] for c in (ch.get("logprobs") or {}).get("content") or []]
        values = [t["logprob"] for c in content for t in c["top_logprobs"]]
        assert content and -9999.0 in values and all(isinstance(v, float) for v in values), (stream, content)


def test_completion_greedy_usage_and_length(server: Server) -> None:
    client = server.client()
    r = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=7, temperature=0)
    (choice,) = r.choices
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7
    again = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=7, temperature=0)
    assert again.choices[0].text == choice.text  # greedy is deterministic


def test_completion_batch_of_prompts_and_n(server: Server) -> None:
    client = server.client()
    r = client.completions.create(model="tiny", prompt=PROMPTS[:2], max_tokens=5, temperature=1.0, n=3, seed=7)
    assert sorted(c.index for c in r.choices) == list(range(6))
    assert r.usage.completion_tokens == 30
    texts = {c.text for c in r.choices[:3]}
    assert len(texts) > 1  # different children sample differently


def test_seed_reproducible_across_calls(server: Server) -> None:
    client = server.client()
    kw = dict(model="tiny", prompt=PROMPTS[1], max_tokens=12, temperature=1.0, top_p=0.9, seed=1234)
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    c = client.completions.create(**{**kw, "seed": 4321}).choices[0].text
    assert a == b
    assert a != c


def test_stop_string(server: Server) -> None:
    client = server.client()
    full = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=12, temperature=0).choices[0].text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip(), full
    r = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=12, temperature=0, stop=[stop])
    (choice,) = r.choices
    assert choice.finish_reason == "stop"
    assert choice.text == full[: full.index(stop)]
    assert choice.stop_reason == stop


def test_logprobs(server: Server) -> None:
    client = server.client()
    r = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and "".join(lp.tokens) == r.choices[0].text
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and len(top) >= 3
        assert max(top.values()) == pytest.approx(chosen, abs=1e-4)  # greedy picks the most likely
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 2 for t in content)
    assert "".join(t.token for t in content) == chat.choices[0].message.content


def test_chat_and_streaming_agree(server: Server) -> None:
    client = server.client()
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=10, temperature=0)
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=10,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    # No reasoning parser: no reasoning count (tests/server/test_chat_tools.py has one).
    assert whole.usage.completion_tokens_details is None and chunks[-1].usage.completion_tokens_details is None


def test_completion_streaming_matches(server: Server) -> None:
    client = server.client()
    whole = client.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=9, temperature=0).choices[0].text
    stream = client.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=9, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == whole


def test_extra_vllm_fields(server: Server) -> None:
    client = server.client()
    r = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=6, temperature=0,
                                  extra_body={"min_tokens": 6, "top_k": 5, "ignore_eos": True,
                                              "repetition_penalty": 1.2, "min_p": 0.0})
    assert r.usage.completion_tokens == 6


def test_many_concurrent_streams_equal_sequential(server: Server) -> None:
    client = server.client()
    prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(24)]
    sequential = [client.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0).choices[0].text
                  for p in prompts]

    async def one(aclient: openai.AsyncOpenAI, p: str) -> str:
        stream = await aclient.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0, stream=True)
        return "".join([c.choices[0].text async for c in stream])

    async def all_at_once() -> list[str]:
        aclient = server.async_client()
        try:
            return await asyncio.gather(*(one(aclient, p) for p in prompts))
        finally:
            await aclient.close()

    assert asyncio.run(all_at_once()) == sequential


def test_tokenize_detokenize(server: Server) -> None:
    r = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()
    assert r["count"] == len(r["tokens"]) > 0 and r["max_model_len"] == 256
    back = httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == "Hello world"
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > r["count"]


def test_streaming_echo_sends_the_prompt_once(server: Server) -> None:
    client = server.client()
    whole = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=6, temperature=0, echo=True)
    assert whole.choices[0].text.startswith(PROMPTS[1])
    stream = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=6, temperature=0, echo=True,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream) == whole.choices[0].text


def test_client_request_id_names_the_response_even_when_reused(server: Server) -> None:
    client = server.client()

    def complete() -> str:
        return client.completions.create(model="tiny", prompt="Hi", max_tokens=2,
                                         extra_body={"request_id": "job-7"}).id

    async def twice_at_once() -> list[str]:
        return await asyncio.gather(asyncio.to_thread(complete), asyncio.to_thread(complete))

    assert asyncio.run(twice_at_once()) == ["cmpl-job-7", "cmpl-job-7"]
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=2, extra_body={"request_id": "job-8"})
    assert chat.id == "chatcmpl-job-8"
    assert client.completions.create(model="tiny", prompt="Hi", max_tokens=1).id.startswith("cmpl-")


@pytest.fixture(scope="module")
def bos_server(smollm2_folder, tmp_path_factory: pytest.TempPathFactory):
    """A server whose tokenizer puts a BOS before every prompt (as Llama's does): SmolLM2's
    with a post-processor that adds ``<|im_start|>``."""
    import json
    import shutil

    from tests.conftest import make_tiny_model
    from tests.server.conftest import start_server, stop_and_check

    tok = tmp_path_factory.mktemp("bos-tokenizer")
    for name in ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "config.json"):
        if (smollm2_folder / name).exists():
            shutil.copy(smollm2_folder / name, tok / name)
    spec = json.loads((smollm2_folder / "tokenizer.json").read_text())
    bos = "<|im_start|>"
    bos_id = spec["model"]["vocab"][bos]
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}
    (tok / "tokenizer.json").write_text(json.dumps(spec))
    model = make_tiny_model(tmp_path_factory.mktemp("bos-model"), tok)
    srv = start_server(model, tmp_path_factory.mktemp("bos-server"), "--served-model-name", "tiny")
    yield srv
    assert stop_and_check(srv) == 0, srv.log()[-3000:]


def test_echo_returns_the_prompt_as_sent_not_with_the_tokenizers_bos(bos_server: Server) -> None:
    client = bos_server.client()
    prompt = PROMPTS[0]
    tokens = httpx.post(bos_server.url + "/tokenize", json={"model": "tiny", "prompt": prompt}).json()["tokens"]
    assert tokens[0] == 1  # <|im_start|>: the model sees a BOS the user did not write
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0, echo=True)
    assert whole.choices[0].text.startswith(prompt), whole.choices[0].text
    assert whole.usage.prompt_tokens == len(tokens)
    stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0, echo=True,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream) == whole.choices[0].text
    only = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    assert only.choices[0].text == prompt
    assert only.choices[0].logprobs.tokens[0] == "<|im_start|>"  # the BOS is still a prompt token
    # Token ids have no text as sent: their decoding is echoed, BOS included.
    ids = client.completions.create(model="tiny", prompt=tokens, max_tokens=0, echo=True)
    assert ids.choices[0].text == "<|im_start|>" + prompt


def test_usage_has_no_prompt_tokens_details_without_the_flag(server: Server) -> None:
    # As vLLM: completions and chat report the prefix-cache hits only with
    # --enable-prompt-tokens-details (tests/security/test_cache_salt.py); without it the
    # key is left out, even where the whole prompt but its last block is a hit.
    prompt = " ".join(f"word{i}" for i in range(40))  # ~130 tokens, 8 blocks
    bodies = [("/v1/completions", {"prompt": prompt}),
              ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]})]
    for path, body in bodies:
        body = {"model": "tiny", "max_tokens": 1, "temperature": 0, **body}
        for _ in range(2):
            usage = httpx.post(server.url + path, json=body, timeout=60).json()["usage"]
            assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}, usage
        streamed = httpx.post(server.url + path, json={**body, "stream": True, "stream_options": {"include_usage": True}},
                              timeout=60).text
        final = [line for line in streamed.splitlines() if line.startswith("data: {")][-1]
        assert '"usage"' in final and "prompt_tokens_details" not in final, final


def test_models_carry_a_permission_and_load_counts_requests_in_flight(server: Server) -> None:
    (card,) = httpx.get(server.url + "/v1/models", timeout=30).json()["data"]
    (permission,) = card["permission"]  # vLLM's card lists one
    assert permission["object"] == "model_permission" and permission["allow_sampling"] is True
    assert permission["id"].startswith("modelperm-") and permission["allow_fine_tuning"] is False
    assert httpx.get(server.url + "/load", timeout=30).json() == {"server_load": 0}
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 64, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # the stream has begun
        assert httpx.get(server.url + "/load", timeout=30).json() == {"server_load": 1}
        assert [line for line in lines if line == "data: [DONE]"]
    assert httpx.get(server.url + "/load", timeout=30).json() == {"server_load": 0}
