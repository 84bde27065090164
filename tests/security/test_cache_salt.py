"""``cache_salt``: requests share prefix-cache blocks only with requests of the same salt.

As vLLM: an optional request field of completions and chat completions (and a key of an
offline prompt dict, as vLLM's ``TextPrompt`` / ``TokensPrompt``), mixed into the prefix-cache
hashes, so that one tenant cannot tell from response times whether another tenant sent a
prompt. It must be a non-empty string: anything else is a 400 naming ``cache_salt``.

The server tests read the prefix-cache hits at ``/metrics``; completions and chat report
them per request in ``usage.prompt_tokens_details.cached_tokens`` only with
``--enable-prompt-tokens-details`` (as vLLM), which this module's server has, and the
last test checks that against ``/metrics``. Offline, ``RequestOutput.num_cached_tokens``
says it per request.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from forkless.sampling_params import SamplingParams
from tests.security.test_http_inputs import assert_openai_error
from tests.server.conftest import Server, start_server, stop_and_check, wait_until
from tests.server.test_metrics import scrape, value

BLOCK = 16  # the default --block-size


@pytest.fixture(scope="module")
def srv(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tiny_llama, tmp_path_factory.mktemp("cache-salt"), "--served-model-name", "tiny",
                     "--enable-prompt-tokens-details")
    yield s
    assert stop_and_check(s) == 0, s.log()[-3000:]


def long_prompt() -> str:
    """A prompt of well over 100 tokens that no other test sends."""
    return f"{uuid.uuid4().hex} " + " ".join(f"word{i}" for i in range(60))


def cached_tokens(srv: Server, send, sequences: int = 1) -> int:
    """Prompt tokens of the request ``send()`` sends that were found in the prefix cache."""
    before = scrape(srv)
    done = value(before, "forkless:request_success_total")
    send()
    # the request's stats reach the stat loggers just before its response is sent
    wait_until(lambda: value(scrape(srv), "forkless:request_success_total") >= done + sequences, 10)
    after = scrape(srv)
    assert value(after, "forkless:request_success_total") == done + sequences
    return int(value(after, "forkless:prefix_cache_hits_total") - value(before, "forkless:prefix_cache_hits_total"))


def test_completions_share_the_cache_only_with_the_same_salt(srv: Server) -> None:
    client = srv.client()
    prompt = long_prompt()
    assert len(httpx.post(srv.url + "/tokenize", json={"prompt": prompt}).json()["tokens"]) > 6 * BLOCK

    def send(**extra):
        return lambda: client.completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0,
                                                 extra_body=extra or None)

    assert cached_tokens(srv, send()) == 0
    shared = cached_tokens(srv, send())  # the same prompt, unsalted both times
    assert shared >= 6 * BLOCK
    salt_a, salt_b = f"tenant-a-{uuid.uuid4()}", f"tenant-b-{uuid.uuid4()}"
    assert cached_tokens(srv, send(cache_salt=salt_a)) == 0  # salted: not the unsalted blocks
    assert cached_tokens(srv, send(cache_salt=salt_b)) == 0  # another salt: not tenant a's
    assert cached_tokens(srv, send(cache_salt=salt_a)) == shared  # the same salt: tenant a's
    assert cached_tokens(srv, send(cache_salt=salt_b)) == shared
    assert cached_tokens(srv, send(cache_salt=None)) == shared  # null is no salt


def test_chat_shares_the_cache_only_with_the_same_salt(srv: Server) -> None:
    client = srv.client()
    messages = [{"role": "user", "content": long_prompt()}]

    def send(salt: str, n: int = 1):
        return lambda: client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, n=n,
                                                      extra_body={"cache_salt": salt, "top_k": 1})

    assert cached_tokens(srv, send("one")) == 0
    assert cached_tokens(srv, send("two")) == 0
    shared = cached_tokens(srv, send("one"))
    assert shared >= 6 * BLOCK
    assert cached_tokens(srv, send("two", n=2), sequences=2) == 2 * shared  # every child is salted
    assert cached_tokens(srv, send("three", n=2), sequences=2) <= shared  # at most one child's blocks


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("salt", ["", 123, 1.5, True, ["a"], {"a": 1}])
def test_a_salt_that_is_not_a_non_empty_string_is_400(srv: Server, path: str, salt) -> None:
    body = {"model": "tiny", "max_tokens": 1, "cache_salt": salt}
    body.update({"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]})
    error = assert_openai_error(httpx.post(srv.url + path, json=body, timeout=60), 400)
    assert error["param"] == "cache_salt" and "cache_salt" in error["message"], error
    assert error["type"] == "BadRequestError", error


def test_offline_prompt_dicts_take_a_salt(tiny_llama: Path) -> None:
    from forkless import LLM

    llm = LLM(str(tiny_llama), kv_cache_memory=1 << 24)
    ids = llm.get_tokenizer().encode(long_prompt())
    params = SamplingParams(max_tokens=1)

    def cached(prompt) -> int:
        (out,) = llm.generate(prompt, params, use_tqdm=False)
        return out.num_cached_tokens

    assert cached({"prompt_token_ids": ids, "cache_salt": "a"}) == 0
    assert cached({"prompt_token_ids": ids}) == 0
    assert cached({"prompt_token_ids": ids, "cache_salt": "b"}) == 0
    shared = cached({"prompt_token_ids": ids, "cache_salt": "a"})
    assert shared >= 6 * BLOCK
    assert cached({"prompt_token_ids": ids, "cache_salt": "b"}) == shared
    text = llm.get_tokenizer().decode(ids)
    assert cached({"prompt": text, "cache_salt": "c"}) == 0
    for bad in ("", 5, b"a"):
        with pytest.raises(ValueError, match="cache_salt"):
            llm.generate({"prompt_token_ids": ids, "cache_salt": bad}, params, use_tqdm=False)


def test_enable_prompt_tokens_details_reports_the_hits_in_usage(srv: Server) -> None:
    # --enable-prompt-tokens-details, vLLM's: completions and chat, streamed (the final
    # usage chunk) or not, report usage.prompt_tokens_details.cached_tokens, the prompt's
    # prefix-cache hits, as /metrics counts them; a prompt without a hit has no details
    # (as vLLM's). Without the flag there are never any (tests/server/test_openai_api.py).
    client = srv.client()
    prompt, messages = long_prompt(), [{"role": "user", "content": long_prompt()}]
    usages = []

    def send(chat: bool, stream: bool):
        kwargs = dict(model="tiny", max_tokens=1, temperature=0)
        if stream:
            kwargs["stream_options"] = {"include_usage": True}
        if chat:
            answer = client.chat.completions.create(messages=messages, stream=stream, **kwargs)
        else:
            answer = client.completions.create(prompt=prompt, stream=stream, **kwargs)
        usages.append(list(answer)[-1].usage if stream else answer.usage)

    for chat in (False, True):
        for stream in (False, True, False):
            hits = cached_tokens(srv, lambda: send(chat, stream))
            details = usages[-1].prompt_tokens_details
            assert (details.cached_tokens if details is not None else 0) == hits, (chat, stream, usages[-1])
            assert details is None or 0 < details.cached_tokens < usages[-1].prompt_tokens
        # The first send of the prompt may hit only the chat template's opening; the
        # second and third hit the whole prompt but its last block.
        assert usages[-1].prompt_tokens_details.cached_tokens >= 6 * BLOCK
        assert usages[-1] == usages[-2]
    assert usages[0].prompt_tokens_details is None  # a new completions prompt: no hit, no details
