"""Structured outputs with a reasoning parser (vLLM's behaviour): a constrained request
reasons unconstrained, and its grammar holds from the token after ``</think>``.

The tiny random model's tokenizer has ``<think>`` and ``</think>`` as single tokens
(``tiny_thinker``). Its output is made to reason either by forcing a prefix
(``force_tokens.py``, which keeps steps synchronous) or, under async scheduling, by a
``logit_bias`` on ``</think>`` (sampled first: the grammar, once it holds, refuses it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import jsonschema
import numpy as np
import openai
import pytest

from forkless import LLM, SamplingParams, StructuredOutputsParams
from forkless.protocol.step import ScheduledRequest, SchedulerOutput
from forkless.structured_output import StructuredOutputsConfig
from tests.conftest import THINK_TOKENS
from tests.server.conftest import Server, start_server
from tests.server.force_tokens import PATH as FORCE
from tests.server.force_tokens import ForceTokensLogitsProcessor

pytestmark = pytest.mark.slow

THINK, END = (next(i for i, t in THINK_TOKENS.items() if t == tag) for tag in ("<think>", "</think>"))
CHOICES = ["yes please", "no thanks"]
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}
SERVER_DIR = str(Path(__file__).resolve().parent.parent / "server")


@pytest.fixture(scope="module")
def tokenizer(tiny_thinker: Path):
    from forkless.tokenizers.loading import load_tokenizer

    return load_tokenizer(tiny_thinker)


# ---------------------------------------------------------------------------- the manager


def _manager(tiny_thinker: Path, prompts: dict[str, list[int]], reasoning_ended: set[str] = frozenset(), **config):
    from forkless.structured_output.manager import StructuredOutputManager

    manager = StructuredOutputManager(StructuredOutputsConfig(backend="xgrammar", reasoning_parser="qwen3", **config),
                                      str(tiny_thinker), 49152, [2])
    for rid, prompt in prompts.items():
        params = StructuredOutputsParams(choice=CHOICES)
        params._reasoning_ended = rid in reasoning_ended
        manager.submit(rid, params, prompt)
    deadline = time.monotonic() + 60
    ready: list[str] = []
    while len(ready) < len(prompts):
        assert time.monotonic() < deadline
        manager.wait(0.1)
        ready += manager.poll()[0]
    return manager


def _fill(manager, drafts: dict[str, list[int]]) -> dict[str, np.ndarray]:
    step = SchedulerOutput(scheduled_requests=[
        ScheduledRequest(rid, [7] + d, 10, [], False, True, num_spec_tokens=len(d)) for rid, d in drafts.items()])
    manager.fill_bitmask(step)
    rows = np.frombuffer(step.grammar_bitmask, dtype=np.int32).reshape(sum(1 + len(d) for d in drafts.values()), -1)
    out, at = {}, 0
    for rid, d in drafts.items():
        out[rid] = rows[at:at + 1 + len(d)].copy()
        at += 1 + len(d)
    return out


def _allows(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


def _out(rid: str, tokens: list[int]) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, new_token_ids=tokens, finish_reason=None)


def test_the_grammar_starts_after_the_reasoning_ends(tiny_thinker: Path, tokenizer) -> None:
    """Rows allow everything, and the grammar takes no token, until ``</think>``; the
    tokens after it in the same step are the grammar's first. A prompt that closed the
    think block, or ``enable_in_reasoning``, constrains from the first token."""
    yes = tokenizer.encode("yes please", add_special_tokens=False)
    word = tokenizer.encode("maybe", add_special_tokens=False)[0]
    manager = _manager(tiny_thinker, {"open": [5, THINK], "closed": [5, THINK, 9, END], "late": [5]})
    try:
        assert manager.reasoning_end_id("open") == END and manager.reasoning_end_id("late") == END
        assert manager.reasoning_end_id("closed") is None
        rows = _fill(manager, {"open": [], "closed": [], "late": []})
        assert (rows["open"] == -1).all() and (rows["late"] == -1).all()
        assert _allows(rows["closed"][0], yes[0]) and not _allows(rows["closed"][0], word)
        # Reasoning tokens the grammar would refuse: taken, not advanced, still thinking.
        complete, rejected = manager.accept([_out("open", [word, 2]), _out("late", [word])])
        assert (complete, rejected) == ([], [])
        assert (_fill(manager, {"open": []})["open"] == -1).all()
        # The end, then the grammar's first token in the same step ("late"); the end
        # alone ("open"): the grammar starts with the next token.
        assert manager.accept([_out("open", [word, END]), _out("late", [END, yes[0]])]) == ([], [])
        assert manager.reasoning_end_id("open") is None and manager.reasoning_end_id("late") is None
        rows = _fill(manager, {"open": [], "late": []})
        assert _allows(rows["open"][0], yes[0]) and not _allows(rows["open"][0], word)
        assert _allows(rows["late"][0], yes[1]) and not _allows(rows["late"][0], yes[0])
        # The grammar completes as usual after the reasoning.
        assert manager.accept([_out("late", yes[1:] + [2])]) == (["late"], [])
    finally:
        manager.shutdown()
    manager = _manager(tiny_thinker, {"r": [5, THINK]}, enable_in_reasoning=True)
    try:
        assert manager.reasoning_end_id("r") is None
        assert not _allows(_fill(manager, {"r": []})["r"][0], THINK)
    finally:
        manager.shutdown()


def test_params_that_say_the_reasoning_ended_constrain_from_the_first_token(tiny_thinker: Path,
                                                                           tokenizer) -> None:
    """The API server's mark for include_reasoning=false (vLLM's reasoning_ended): the
    grammar holds from the first token though the prompt leaves the model thinking."""
    yes = tokenizer.encode("yes please", add_special_tokens=False)
    manager = _manager(tiny_thinker, {"open": [5, THINK], "ended": [5, THINK]}, reasoning_ended={"ended"})
    try:
        assert manager.reasoning_end_id("open") == END and manager.reasoning_end_id("ended") is None
        rows = _fill(manager, {"open": [], "ended": []})
        assert (rows["open"] == -1).all()
        assert _allows(rows["ended"][0], yes[0]) and not _allows(rows["ended"][0], END)
    finally:
        manager.shutdown()
    # The mark crosses processes with the params (the grammar process decodes them).
    import msgspec

    params = StructuredOutputsParams(choice=CHOICES)
    params._reasoning_ended = True
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=StructuredOutputsParams)._reasoning_ended


def test_drafts_that_cross_the_end_are_verified_under_the_grammar_after_it(tiny_thinker: Path,
                                                                           tokenizer) -> None:
    """A thinking request verifying drafts: the rows up to a drafted ``</think>`` allow
    everything; the rows after it are the grammar's, from its start, through the drafts
    it accepts; without a drafted end every row allows everything."""
    yes = tokenizer.encode("yes please", add_special_tokens=False)
    word = tokenizer.encode("maybe", add_special_tokens=False)[0]
    manager = _manager(tiny_thinker, {"r": [5, THINK]})
    try:
        assert (_fill(manager, {"r": [word, word]})["r"] == -1).all()
        rows = _fill(manager, {"r": [word, END, yes[0], word]})["r"]
        assert (rows[:2] == -1).all()  # the positions of word and of </think>
        assert _allows(rows[2], yes[0]) and not _allows(rows[2], word)  # the grammar's start
        assert _allows(rows[3], yes[1]) and not _allows(rows[3], yes[0])  # after yes[0]
        assert manager.reasoning_end_id("r") == END  # planning drafts changes nothing
        assert (_fill(manager, {"r": []})["r"] == -1).all()
    finally:
        manager.shutdown()


# ---------------------------------------------------------------------------- the engine


def _think_and_answer(llm: LLM, tokenizer) -> None:
    """A forced ``<think>`` block (tokens the grammar refuses) and then the grammar's
    answer; a request of the same prompt without reasoning is constrained as before."""
    reasoning = tokenizer.encode("maybe {", add_special_tokens=False)
    prefix = [THINK, *reasoning, END]
    params = SamplingParams(temperature=0, max_tokens=40, extra_args={"forced_prefix_ids": prefix},
                            structured_outputs=StructuredOutputsParams(choice=CHOICES))
    plain = SamplingParams(temperature=0, max_tokens=40, structured_outputs=StructuredOutputsParams(choice=CHOICES))
    closed = tokenizer.encode("Hi", add_special_tokens=False) + [THINK, END]
    got, answered = llm.generate([{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": closed}], [params, plain],
                                 use_tqdm=False)
    ids = list(got.outputs[0].token_ids)
    assert ids[:len(prefix)] == prefix
    assert tokenizer.decode(ids[len(prefix):], skip_special_tokens=True) in CHOICES
    assert got.outputs[0].finish_reason == "stop"
    assert answered.outputs[0].text in CHOICES


@pytest.mark.parametrize("grammar_process", ["0", "1"], ids=["in-core", "grammar-process"])
def test_forced_reasoning_then_a_constrained_answer(tiny_thinker: Path, tokenizer, grammar_process: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESS", grammar_process)
    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESSES", "1")
    llm = LLM(str(tiny_thinker), max_model_len=256, kv_cache_memory=1 << 24, reasoning_parser="qwen3",
              logits_processors=[ForceTokensLogitsProcessor])
    try:
        _think_and_answer(llm, tokenizer)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("grammar_process", ["0", "1"], ids=["in-core", "grammar-process"])
def test_reasoning_under_async_scheduling(tiny_thinker: Path, tokenizer, grammar_process: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Async steps (deferred bitmasks): the first token, ``</think>`` (biased), is
    sampled unconstrained, and the grammar holds from the very next one."""
    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESS", grammar_process)
    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESSES", "1")
    llm = LLM(str(tiny_thinker), max_model_len=256, kv_cache_memory=1 << 24, reasoning_parser="qwen3",
              async_scheduling=True)
    try:
        params = [SamplingParams(temperature=t, seed=None, max_tokens=40, logit_bias={END: 100.0},
                                 structured_outputs=StructuredOutputsParams(choice=CHOICES)) for t in (0.0, 1.0)] * 3
        outs = llm.generate([{"prompt_token_ids": [5, 6 + i]} for i in range(len(params))], params, use_tqdm=False)
        for out in outs:
            ids = list(out.outputs[0].token_ids)
            assert ids[0] == END and END not in ids[1:], ids
            assert tokenizer.decode(ids[1:], skip_special_tokens=True) in CHOICES
            assert out.outputs[0].finish_reason == "stop"
    finally:
        llm.shutdown()


# ---------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server(tiny_thinker: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tiny_thinker, tmp_path_factory.mktemp("reasoning"), "--logits-processors", FORCE,
                       "--reasoning-parser", "qwen3",
                       "--structured-outputs-config", '{"disable_any_whitespace": true}',
                       env_extra={"PYTHONPATH": SERVER_DIR})
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


REASONING = "The user wants yes or no {"


def _request(tokenizer) -> dict:
    prefix = tokenizer.encode(f"<think>{REASONING}</think>", add_special_tokens=False)
    assert prefix[0] == THINK and prefix[-1] == END
    return dict(messages=[{"role": "user", "content": "Yes or no?"}], temperature=0, max_tokens=60,
                response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
                extra_body={"extra_args": {"forced_prefix_ids": prefix}})


def test_the_server_splits_reasoning_from_schema_valid_content(server: Server, tokenizer) -> None:
    client: openai.OpenAI = server.client()
    model = client.models.list().data[0].id
    choice = client.chat.completions.create(model=model, **_request(tokenizer)).choices[0]
    assert choice.message.reasoning == REASONING
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    assert choice.finish_reason == "stop"
    reasoning = content = ""
    for chunk in client.chat.completions.create(model=model, stream=True, **_request(tokenizer)):
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning", None) or ""
            content += c.delta.content or ""
    assert (reasoning, content) == (REASONING, choice.message.content)


def test_without_the_reasoning_a_constraint_holds_from_the_first_token(server: Server) -> None:
    # vLLM's reasoning_ended=True for include_reasoning=false: the model does not think
    # first. </think>, biased, is what an unconstrained reasoning starts with; the grammar
    # refuses it, and the whole reply is the schema's.
    client: openai.OpenAI = server.client()
    kw = dict(model=client.models.list().data[0].id, messages=[{"role": "user", "content": "Yes or no?"}],
              temperature=0, max_tokens=60, logit_bias={str(END): 100},
              response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}})
    thinking = client.chat.completions.create(extra_body={"return_token_ids": True}, **kw).choices[0]
    assert thinking.token_ids[0] == END
    hidden = client.chat.completions.create(extra_body={"include_reasoning": False}, **kw)
    choice = hidden.choices[0]
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    assert choice.message.reasoning is None and choice.finish_reason == "stop"
    assert hidden.usage.completion_tokens == len(thinking.token_ids) - 1
    content = ""
    for chunk in client.chat.completions.create(stream=True, extra_body={"include_reasoning": False}, **kw):
        for c in chunk.choices:
            assert getattr(c.delta, "reasoning", None) is None
            content += c.delta.content or ""
    assert content == choice.message.content
