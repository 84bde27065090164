"""``thinking_token_budget`` and a request's own ``chat_template`` (vLLM's), against real servers.

The tiny model is made to think forever (``force_tokens.ThinkForeverLogitsProcessor``): it
writes ``<think>`` and then reasoning that never ends, and only once its output holds
``</think>`` does it answer. So an answer appears only when the engine's budget forces the
end of the reasoning. ``<think>`` and ``</think>`` are three tokens each in the tiny
model's vocabulary (SmolLM2's): the end marker is forced over three steps.
"""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from forkless import LLM, SamplingParams
from tests.server.conftest import Server, start_server
from tests.server.force_tokens import THINK_FOREVER, ThinkForeverLogitsProcessor

HERE = Path(__file__).resolve().parent
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]
TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[answer]"
UNTRUSTED = ("Chat template is passed with request, but --trust-request-chat-template is not set. "
             "Refused request with untrusted chat template.")


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


@pytest.fixture(scope="module")
def script(tokenizer) -> dict:
    """What the model writes: ``<think>``, 40 reasoning tokens and then the last one
    forever; after ``</think>``, the answer and EOS."""
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    reasoning = enc("\nLet me see." + " hmm" * 20)[:40]
    assert len(reasoning) == 40
    answer = enc("\n\nThe answer is 4.")
    return {"start": enc("<think>"), "end": enc("</think>"), "reasoning": reasoning, "answer": answer,
            "extra_args": {"thinking_ids": enc("<think>") + reasoning, "end_ids": enc("</think>"),
                           "answer_ids": answer + [tokenizer.eos_token_id]}}


@pytest.fixture(scope="module")
def thinker(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # Async scheduling: the budget's requests must still see their latest token.
    srv = start_server(tiny_llama, tmp_path_factory.mktemp("thinker"), "--logits-processors", THINK_FOREVER,
                       "--reasoning-parser", "qwen3", "--trust-request-chat-template", "--async-scheduling",
                       env_extra={"PYTHONPATH": str(HERE)})
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def _chat(srv: Server, **body) -> httpx.Response:
    return httpx.post(srv.url + "/v1/chat/completions", json={"messages": MESSAGES, **body}, timeout=120)


def test_the_budget_ends_the_reasoning_after_that_many_tokens_for_every_choice(thinker: Server, tokenizer,
                                                                                script: dict) -> None:
    r = _chat(thinker, n=2, max_tokens=120, thinking_token_budget=5, vllm_xargs=script["extra_args"])
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["choices"]) == 2
    for choice in body["choices"]:
        assert choice["finish_reason"] == "stop"
        assert choice["message"]["reasoning"] == tokenizer.decode(script["reasoning"][:5])
        assert choice["message"]["content"] == tokenizer.decode(script["answer"])
    # The parser's count of the reasoning: the budget, per choice.
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2 * 5
    out = len(script["start"]) + 5 + len(script["end"]) + len(script["answer"]) + 1  # + EOS
    assert body["usage"]["completion_tokens"] == 2 * out


def test_the_budget_in_a_stream(thinker: Server, tokenizer, script: dict) -> None:
    body = {"messages": MESSAGES, "stream": True, "n": 2, "max_tokens": 120, "thinking_token_budget": 7,
            "vllm_xargs": script["extra_args"]}
    reasoning, content = ["", ""], ["", ""]
    with httpx.stream("POST", thinker.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta = choice["delta"]
                reasoning[choice["index"]] += delta.get("reasoning") or ""
                content[choice["index"]] += delta.get("content") or ""
    assert reasoning == [tokenizer.decode(script["reasoning"][:7])] * 2
    assert content == [tokenizer.decode(script["answer"])] * 2


def test_budgets_of_a_batch_are_each_their_own(thinker: Server, tokenizer, script: dict) -> None:
    budgets = [0, 3, 12, None, -1]
    with concurrent.futures.ThreadPoolExecutor(len(budgets)) as pool:
        replies = list(pool.map(lambda b: _chat(thinker, max_tokens=30, thinking_token_budget=b,
                                                vllm_xargs=script["extra_args"]), budgets))
    for budget, r in zip(budgets, replies):
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        if budget is None or budget == -1:  # no limit: it thinks until max_tokens
            assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
            continue
        assert choice["message"]["reasoning"] == tokenizer.decode(script["reasoning"][:budget])
        assert choice["message"]["content"] == tokenizer.decode(script["answer"])


def test_completions_take_the_budget_too(thinker: Server, tokenizer, script: dict) -> None:
    r = httpx.post(thinker.url + "/v1/completions", json={
        "prompt": "2 + 2 =", "max_tokens": 60, "thinking_token_budget": 4, "vllm_xargs": script["extra_args"]},
        timeout=120)
    assert r.status_code == 200, r.text
    ids = script["start"] + script["reasoning"][:4] + script["end"] + script["answer"]
    assert r.json()["choices"][0]["text"] == tokenizer.decode(ids)


@pytest.mark.parametrize("budget", [-2, 1.5, True, "3"])
def test_a_budget_that_is_not_a_count_is_a_400_naming_it(thinker: Server, budget) -> None:
    r = _chat(thinker, thinking_token_budget=budget)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "thinking_token_budget"


def test_without_reasoning_markers_a_budget_is_a_400(server: Server) -> None:
    # vLLM's answer when neither --reasoning-parser nor --reasoning-config is given.
    for path, body in (("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "Hi"})):
        r = httpx.post(server.url + path, json={**body, "max_tokens": 4, "thinking_token_budget": 3}, timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "thinking_token_budget"
        assert error["message"] == ("thinking_token_budget is set but reasoning_config is not configured. Please "
                                    "set --reasoning-parser and/or --reasoning-config to use "
                                    "thinking_token_budget.")
    # -1 asks for nothing: accepted.
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "thinking_token_budget": -1},
                   timeout=60)
    assert r.status_code == 200, r.text


def test_offline_budget_with_a_closing_phrase(tiny_llama: Path, tokenizer, script: dict) -> None:
    # vLLM's --reasoning-config: the end string may lead in with a phrase, forced whole.
    llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24,
              reasoning_config={"reasoning_start_str": "<think>", "reasoning_end_str": "Time to answer.</think>"},
              logits_processors=[ThinkForeverLogitsProcessor])
    try:
        phrase = tokenizer.encode("Time to answer.</think>", add_special_tokens=False)
        params = SamplingParams(n=2, max_tokens=80, thinking_token_budget=6, extra_args=script["extra_args"])
        (out,) = llm.generate(["2 + 2 ="], params, use_tqdm=False)
        expected = script["start"] + script["reasoning"][:6] + phrase + script["answer"] + [tokenizer.eos_token_id]
        assert [list(c.token_ids) for c in out.outputs] == [expected, expected]
        # A start marker in the prompt (a template that opens the reasoning) counts from there.
        prompt = tokenizer.encode("2 + 2 =", add_special_tokens=False) + script["start"]
        (out,) = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
            max_tokens=80, thinking_token_budget=2, extra_args={**script["extra_args"], "thinking_ids": [5, 6, 7]}),
            use_tqdm=False)
        assert list(out.outputs[0].token_ids) == [5, 6] + phrase + script["answer"] + [tokenizer.eos_token_id]
    finally:
        llm.shutdown()


def test_offline_budget_without_reasoning_markers_is_refused(tiny_llama: Path) -> None:
    from forkless.config import EngineArgs
    from forkless.engine.processor import Processor

    processor = Processor(EngineArgs(model=str(tiny_llama)).create_engine_config())
    with pytest.raises(ValueError, match="reasoning_config is not configured"):
        processor.process_inputs("r", "Hi", SamplingParams(thinking_token_budget=3))


# -- a request's own chat template -------------------------------------------------------------

def test_a_trusted_request_template_renders_the_prompt(thinker: Server, tokenizer) -> None:
    rendered = tokenizer.encode("[user] What is 2 + 2?\n[answer]", add_special_tokens=False)
    r = httpx.post(thinker.url + "/tokenize", json={"messages": MESSAGES, "chat_template": TEMPLATE}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == rendered
    default = httpx.post(thinker.url + "/tokenize", json={"messages": MESSAGES}, timeout=60).json()["tokens"]
    assert default != rendered  # the model's own template
    r = _chat(thinker, chat_template=TEMPLATE, max_tokens=1)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(rendered)
    assert _chat(thinker, max_tokens=1).json()["usage"]["prompt_tokens"] == len(default)
    # As vLLM: a template among the template's variables is refused even when trusted.
    r = _chat(thinker, chat_template_kwargs={"chat_template": TEMPLATE}, max_tokens=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text
    assert "unexpected chat template kwargs" in r.json()["error"]["message"]
    # ... and so is tokenize (it was dropped without a word).
    r = _chat(thinker, chat_template_kwargs={"tokenize": True, "enable_thinking": False}, max_tokens=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text
    assert "{'tokenize'}" in r.json()["error"]["message"]


def test_an_untrusted_request_template_is_a_400(server: Server) -> None:
    for path, body, param in (
            ("/v1/chat/completions", {"messages": MESSAGES, "chat_template": TEMPLATE, "max_tokens": 2},
             "chat_template"),
            ("/v1/chat/completions", {"messages": MESSAGES, "chat_template_kwargs": {"chat_template": TEMPLATE},
                                      "max_tokens": 2}, "chat_template_kwargs"),
            ("/tokenize", {"messages": MESSAGES, "chat_template": TEMPLATE}, "chat_template"),
            ("/v1/responses", {"input": "Hi", "chat_template_kwargs": {"chat_template": TEMPLATE},
                               "max_output_tokens": 2}, "chat_template_kwargs")):
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert error["message"] == UNTRUSTED and error["param"] == param, (path, error)
