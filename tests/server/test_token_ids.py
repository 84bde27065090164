"""vLLM's request fields that return token ids or shape a stream, against real servers
through the official ``openai`` client (vLLM's fields in ``extra_body``): ``return_token_ids``,
``return_tokens_as_token_ids`` (and ``--return-tokens-as-token-ids``), chat ``echo``,
``include_reasoning`` without a reasoning parser, and ``stream_interval`` (and
``--stream-interval``).

The tiny random Llama writes greedy nonsense; ``ignore_eos`` makes every answer as long as
``max_tokens``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest

from tests.server.conftest import Server, start_server

PROMPTS = ["The capital of France is", "Once upon a time"]
MESSAGES = [{"role": "user", "content": "Name a color."}]
PREFILL = "My favourite colour is"
CONTINUED = [*MESSAGES, {"role": "assistant", "content": PREFILL}]
TOKEN_ID = re.compile(r"token_id:(\d+)")


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


def _tokenize(server: Server, **body: Any) -> list[int]:
    r = httpx.post(server.url + "/tokenize", json={"model": "tiny", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def _ids_of(tokens: list[str]) -> list[int]:
    """The ids of logprobs' ``"token_id:N"`` names (each must be one)."""
    ids = []
    for token in tokens:
        match = TOKEN_ID.fullmatch(token)
        assert match, token
        ids.append(int(match.group(1)))
    return ids


# -- return_token_ids --------------------------------------------------------------------------

def test_completions_return_the_prompt_and_generated_token_ids(server: Server, tokenizer) -> None:
    client = server.client()
    kw = dict(model="tiny", prompt=PROMPTS, n=2, max_tokens=8)
    body = {"ignore_eos": True, "return_token_ids": True, "top_k": 1}  # deterministic; greedy allows n=1 only
    whole = client.completions.create(extra_body=body, **kw)
    assert len(whole.choices) == 4
    for choice in whole.choices:
        assert choice.prompt_token_ids == _tokenize(server, prompt=PROMPTS[choice.index // 2])
        assert len(choice.token_ids) == 8
        assert tokenizer.decode(choice.token_ids, skip_special_tokens=True) == choice.text
    assert whole.usage.completion_tokens == sum(len(c.token_ids) for c in whole.choices)
    plain = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=2)
    assert plain.choices[0].token_ids is None and plain.choices[0].prompt_token_ids is None

    # Streamed (vLLM's shape): a choice's first chunk has its prompt's ids, every chunk the
    # ids it adds.
    ids: dict[int, list[int]] = defaultdict(list)
    prompt_ids: dict[int, list[int]] = {}
    for chunk in client.completions.create(stream=True, extra_body=body, **kw):
        for c in chunk.choices:
            if c.index not in prompt_ids:
                assert c.prompt_token_ids is not None, "the choice's first chunk has the prompt's ids"
                prompt_ids[c.index] = c.prompt_token_ids
            else:
                assert c.prompt_token_ids is None
            ids[c.index] += c.token_ids
    assert prompt_ids == {c.index: c.prompt_token_ids for c in whole.choices}
    assert dict(ids) == {c.index: c.token_ids for c in whole.choices}


def test_completions_echo_with_return_token_ids_echoes_the_ids(server: Server) -> None:
    # vLLM's rule: with return_token_ids the echoed prompt is its ids (prompt_token_ids),
    # not its text.
    client = server.client()
    kw = dict(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0, echo=True)
    echoed = client.completions.create(**kw).choices[0]
    assert echoed.text.startswith(PROMPTS[0])
    choice = client.completions.create(extra_body={"return_token_ids": True}, **kw).choices[0]
    assert choice.text == echoed.text[len(PROMPTS[0]):]
    assert choice.prompt_token_ids == _tokenize(server, prompt=PROMPTS[0])
    streamed = list(client.completions.create(stream=True, extra_body={"return_token_ids": True}, **kw))
    assert "".join(c.text for chunk in streamed for c in chunk.choices) == choice.text
    assert streamed[0].choices[0].prompt_token_ids == choice.prompt_token_ids
    assert [t for chunk in streamed for c in chunk.choices for t in c.token_ids] == choice.token_ids


def test_chat_returns_the_prompt_and_generated_token_ids(server: Server, tokenizer) -> None:
    client = server.client()
    kw = dict(model="tiny", messages=MESSAGES, n=2, max_tokens=8)
    body = {"ignore_eos": True, "return_token_ids": True, "top_k": 1}  # deterministic; greedy allows n=1 only
    whole = client.chat.completions.create(extra_body=body, **kw)
    assert whole.prompt_token_ids == _tokenize(server, messages=MESSAGES)
    for choice in whole.choices:
        assert len(choice.token_ids) == 8
        assert tokenizer.decode(choice.token_ids, skip_special_tokens=True) == choice.message.content
    assert client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).prompt_token_ids is None

    # Streamed: each choice's role chunk has the prompt's ids, every chunk the ids it adds.
    ids: dict[int, list[int]] = defaultdict(list)
    with_prompt = []
    for chunk in client.chat.completions.create(stream=True, extra_body=body, **kw):
        if chunk.prompt_token_ids is not None:
            with_prompt.append((chunk.choices[0].index, chunk.choices[0].delta.role, chunk.prompt_token_ids))
        for c in chunk.choices:
            ids[c.index] += c.token_ids or []
    assert with_prompt == [(i, "assistant", whole.prompt_token_ids) for i in range(2)]
    assert dict(ids) == {c.index: c.token_ids for c in whole.choices}


# -- return_tokens_as_token_ids ----------------------------------------------------------------

def test_completions_logprobs_name_tokens_by_id(server: Server) -> None:
    client = server.client()
    kw = dict(model="tiny", prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=2)
    body = {"ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
    choice = client.completions.create(extra_body=body, **kw).choices[0]
    lp = choice.logprobs
    assert _ids_of(lp.tokens) == choice.token_ids
    for token, top in zip(lp.tokens, lp.top_logprobs):
        assert token in top and len(top) >= 2
        _ids_of(list(top))
    text = client.completions.create(extra_body={"ignore_eos": True}, **kw).choices[0]
    assert lp.text_offset == text.logprobs.text_offset  # offsets still index the text
    assert lp.token_logprobs == pytest.approx(text.logprobs.token_logprobs, abs=1e-4)
    streamed = [t for chunk in client.completions.create(stream=True, extra_body=body, **kw)
                for c in chunk.choices for t in (c.logprobs.tokens if c.logprobs else [])]
    assert streamed == lp.tokens
    # The echoed prompt's tokens are named by id too.
    echoed = client.completions.create(echo=True, extra_body={"return_tokens_as_token_ids": True}, **kw).choices[0]
    prompt = _tokenize(server, prompt=PROMPTS[0])
    assert _ids_of(echoed.logprobs.tokens) == prompt + choice.token_ids
    assert echoed.text.startswith(PROMPTS[0])


def test_chat_logprobs_name_tokens_by_id(server: Server) -> None:
    client = server.client()
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    body = {"ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
    choice = client.chat.completions.create(extra_body=body, **kw).choices[0]
    content = choice.logprobs.content
    assert _ids_of([e.token for e in content]) == choice.token_ids
    for entry in content:
        assert len(entry.top_logprobs) == 2
        _ids_of([t.token for t in entry.top_logprobs])
        # As vLLM: an alternative's bytes are its name's.
        assert all(t.bytes == list(t.token.encode()) for t in entry.top_logprobs)
    streamed = [e.token for chunk in client.chat.completions.create(stream=True, extra_body=body, **kw)
                for c in chunk.choices for e in (c.logprobs.content if c.logprobs else [])]
    assert streamed == [e.token for e in content]
    named = client.chat.completions.create(extra_body={"ignore_eos": True}, **kw).choices[0].logprobs.content
    assert not any(TOKEN_ID.fullmatch(e.token) for e in named)


@pytest.fixture(scope="module")
def flag_server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tiny_llama, tmp_path_factory.mktemp("flags"), "--served-model-name", "tiny",
                       "--return-tokens-as-token-ids", "--stream-interval", "3")
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def test_the_server_flag_names_tokens_by_id_unless_a_request_says_not(flag_server: Server) -> None:
    client = flag_server.client()
    kw = dict(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=1)
    choice = client.completions.create(extra_body={"return_token_ids": True}, **kw).choices[0]
    assert _ids_of(choice.logprobs.tokens) == choice.token_ids
    named = client.completions.create(extra_body={"return_tokens_as_token_ids": False}, **kw).choices[0]
    assert not any(TOKEN_ID.fullmatch(t) for t in named.logprobs.tokens)
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, logprobs=True)
    assert all(TOKEN_ID.fullmatch(e.token) for e in chat.choices[0].logprobs.content)


# -- stream_interval ---------------------------------------------------------------------------

def _chunk_sizes(client: openai.OpenAI, chat: bool, **extra: Any) -> list[int]:
    """How many generated tokens each chunk of a 13-token stream carries (its token ids')."""
    body = {"ignore_eos": True, "return_token_ids": True, **extra}
    if chat:
        stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=13, temperature=0,
                                                stream=True, extra_body=body)
    else:
        stream = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=13, temperature=0,
                                           stream=True, extra_body=body)
    sizes = [len(c.token_ids) for chunk in stream for c in chunk.choices if c.token_ids]
    assert sum(sizes) == 13
    return sizes


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_stream_interval_puts_that_many_tokens_in_a_chunk(server: Server, chat: bool) -> None:
    client = server.client()
    every = _chunk_sizes(client, chat)
    assert len(every) > 4
    # The first chunk at once (one token), then one every 4 tokens, the last when it ends.
    sizes = _chunk_sizes(client, chat, stream_interval=4)
    assert len(sizes) <= 4 and all(size >= 4 for size in sizes[1:-1]), sizes
    # Unstreamed, it changes nothing (as vLLM).
    kw = dict(model="tiny", max_tokens=5, temperature=0)
    assert client.completions.create(prompt=PROMPTS[0], extra_body={"stream_interval": 4}, **kw).choices[0].text == \
        client.completions.create(prompt=PROMPTS[0], **kw).choices[0].text
    r = httpx.post(server.url + "/v1/completions", timeout=60,
                   json={"model": "tiny", "prompt": PROMPTS[0], "stream": True, "stream_interval": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_interval", r.text


def test_the_server_stream_interval_is_the_least_a_request_gets(flag_server: Server) -> None:
    client = flag_server.client()
    for chat in (False, True):
        for extra in ({}, {"stream_interval": 1}):
            sizes = _chunk_sizes(client, chat, **extra)
            assert len(sizes) <= 6 and all(size >= 3 for size in sizes[1:-1]), (chat, extra, sizes)
        sizes = _chunk_sizes(client, chat, stream_interval=6)
        assert len(sizes) <= 4 and all(size >= 6 for size in sizes[1:-1]), (chat, sizes)


# -- chat echo ---------------------------------------------------------------------------------

def test_chat_echo_puts_the_continued_message_first(server: Server) -> None:
    client = server.client()
    kw = dict(model="tiny", messages=CONTINUED, max_tokens=6)
    body = {"ignore_eos": True, "add_generation_prompt": False, "continue_final_message": True,
            "top_k": 1}  # deterministic; greedy allows n=1 only
    plain = client.chat.completions.create(extra_body=body, **kw).choices[0].message.content
    echoed = client.chat.completions.create(n=2, extra_body={**body, "echo": True}, **kw)
    assert [c.message.content for c in echoed.choices] == [PREFILL + plain] * 2
    # As vLLM: an echo asks for the prompt's logprobs, which the reply carries.
    assert len(echoed.prompt_logprobs) == echoed.usage.prompt_tokens and echoed.prompt_logprobs[0] is None
    # Streamed: after each choice's role chunk, a chunk of the echo, then the reply.
    deltas: dict[int, list[str]] = defaultdict(list)
    for chunk in client.chat.completions.create(n=2, stream=True, extra_body={**body, "echo": True}, **kw):
        for c in chunk.choices:
            if c.delta.content:
                deltas[c.index].append(c.delta.content)
    assert {i: (d[0], "".join(d)) for i, d in deltas.items()} == {i: (PREFILL, PREFILL + plain) for i in range(2)}
    # Beam search too: each beam's reply starts with the echo.
    beam_body = {k: v for k, v in body.items() if k != "top_k"}
    beams = client.chat.completions.create(n=2, extra_body={**beam_body, "echo": True, "use_beam_search": True}, **kw)
    assert all(c.message.content.startswith(PREFILL) for c in beams.choices) and len(beams.choices) == 2
    # A message of text parts is echoed as its texts joined by newlines (vLLM's rule).
    parts = [*MESSAGES, {"role": "assistant", "content": [{"type": "text", "text": "My favourite"},
                                                          {"type": "text", "text": "colour is"}]}]
    reply = client.chat.completions.create(model="tiny", messages=parts, max_tokens=2,
                                           extra_body={**body, "echo": True}).choices[0].message.content
    assert reply.startswith("My favourite\ncolour is")


def test_chat_echo_needs_the_last_message_in_the_reply_role(server: Server) -> None:
    # After a generation prompt the reply is the assistant's: a last user message is not echoed.
    client = server.client()
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    plain = client.chat.completions.create(**kw).choices[0].message.content
    kw["extra_body"] = {"ignore_eos": True, "echo": True}
    assert client.chat.completions.create(**kw).choices[0].message.content == plain
    streamed = "".join(c.delta.content or "" for chunk in client.chat.completions.create(stream=True, **kw)
                       for c in chunk.choices)
    assert streamed == plain


def test_include_reasoning_false_without_a_reasoning_parser_changes_nothing(server: Server) -> None:
    # Without --reasoning-parser there is no reasoning to leave out: the reply, its logprobs
    # and its token ids are as they are without the field.
    client = server.client()
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True)
    shown = client.chat.completions.create(extra_body={"ignore_eos": True, "return_token_ids": True}, **kw)
    hidden = client.chat.completions.create(
        extra_body={"ignore_eos": True, "return_token_ids": True, "include_reasoning": False}, **kw)
    for a, b in ((shown, hidden),):
        assert a.choices[0].message.content == b.choices[0].message.content
        assert a.choices[0].token_ids == b.choices[0].token_ids
        assert [e.token for e in a.choices[0].logprobs.content] == [e.token for e in b.choices[0].logprobs.content]
