"""Structured outputs through the offline ``LLM`` on the default model (SmolLM2-135M-Instruct):
every output satisfies its constraint, for both built-in backends, greedy and sampled;
unconstrained requests in the same batches are untouched; async scheduling and
speculative decoding keep constrained requests correct."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from forkless import LLM, SamplingParams, StructuredOutputsParams
from tests.structured_output.schemas import CHOICES, EBNF, LARK, PROMPTS, REGEX, SCHEMAS

pytestmark = pytest.mark.slow

UNCONSTRAINED = ["The capital of France is", "def fibonacci(n):"]


def _chat(llm: LLM, question: str) -> str:
    return llm.get_tokenizer().apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                   add_generation_prompt=True)


def _llm(model: Path, **kwargs: Any) -> LLM:
    return LLM(str(model), max_model_len=512, max_num_seqs=16, **kwargs)


@pytest.fixture(scope="module", params=["xgrammar", "guidance"])
def llm(request: pytest.FixtureRequest, smollm2_folder: Path):
    engine = _llm(smollm2_folder, structured_outputs_config={"backend": request.param})
    engine.backend = request.param  # type: ignore[attr-defined]
    yield engine
    engine.shutdown()


def _json_batch(llm: LLM) -> tuple[list[str], list[SamplingParams], list[tuple[str, float]]]:
    prompts, params, cases = [], [], []
    for name, schema in SCHEMAS.items():
        for temperature in (0.0, 0.8):
            prompts.append(_chat(llm, PROMPTS[name]))
            params.append(SamplingParams(temperature=temperature, seed=7 if temperature else None, max_tokens=120,
                                         structured_outputs=StructuredOutputsParams(json=schema)))
            cases.append((name, temperature))
    return prompts, params, cases


def test_json_schemas_in_a_mixed_batch(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    alone = [o.outputs[0].token_ids for o in llm.generate(UNCONSTRAINED, greedy, use_tqdm=False)]
    prompts, params, cases = _json_batch(llm)
    outputs = llm.generate(prompts + UNCONSTRAINED, params + [greedy] * len(UNCONSTRAINED), use_tqdm=False)
    for (name, temperature), out in zip(cases, outputs):
        text = out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop", (name, temperature, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    # The unconstrained requests of the batch got exactly what they get alone.
    assert [o.outputs[0].token_ids for o in outputs[len(cases):]] == alone


def test_regex_choice_grammar_and_json_object(llm: LLM) -> None:
    grammar = EBNF if llm.backend == "xgrammar" else LARK  # type: ignore[attr-defined]
    constraints = [
        (_chat(llm, "Give me a phone number."), StructuredOutputsParams(regex=REGEX),
         lambda t: re.fullmatch(REGEX, t)),
        (_chat(llm, "What is the capital of France?"), StructuredOutputsParams(choice=CHOICES),
         lambda t: t in CHOICES),
        (_chat(llm, "Is the sky blue?"), StructuredOutputsParams(grammar=grammar),
         lambda t: re.fullmatch(r"The answer is (yes|no)\.", t)),
        (_chat(llm, PROMPTS["person"]), StructuredOutputsParams(json_object=True, disable_any_whitespace=True),
         lambda t: isinstance(json.loads(t), dict) and "\n" not in t),
    ]
    cases = [(c, t) for t in (0.0, 1.0) for c in constraints]
    params = [SamplingParams(temperature=t, seed=3 if t else None, max_tokens=80, structured_outputs=so)
              for (_, so, _), t in cases]
    outputs = llm.generate([p for (p, _, _), _ in cases], params, use_tqdm=False)
    for ((_, so, check), temperature), out in zip(cases, outputs):
        text = out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop" and check(text), (so.kind, temperature, text)


def test_a_complete_grammar_finishes_with_stop_even_with_ignore_eos(llm: LLM) -> None:
    out = llm.generate([_chat(llm, "Capital of France?")],
                       SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                      structured_outputs=StructuredOutputsParams(choice=CHOICES)), use_tqdm=False)
    assert out[0].outputs[0].text in CHOICES and out[0].outputs[0].finish_reason == "stop"


@pytest.mark.parametrize(("so", "message"), [
    (StructuredOutputsParams(regex="[0-9"), "regex"),
    (StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "strin"}}}), "strin"),
    (StructuredOutputsParams(grammar="root ::= undefined_rule"), "undefined_rule"),
])
def test_a_bad_constraint_is_a_value_error_naming_it(llm: LLM, so: StructuredOutputsParams, message: str) -> None:
    with pytest.raises(ValueError, match="structured_outputs") as info:
        llm.generate(["Hi"], SamplingParams(max_tokens=4, structured_outputs=so), use_tqdm=False)
    assert message in str(info.value)
    # The engine goes on.
    assert llm.generate(["Hi"], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids


def _greedy_cases(llm: LLM) -> tuple[list[str], list[SamplingParams]]:
    prompts = [_chat(llm, PROMPTS["person"]), _chat(llm, PROMPTS["array"]), _chat(llm, "Capital of France?")]
    params = [SamplingParams(temperature=0, max_tokens=80, structured_outputs=StructuredOutputsParams(json=SCHEMAS[n]))
              for n in ("person", "array")]
    params.append(SamplingParams(temperature=0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=CHOICES)))
    return prompts + UNCONSTRAINED, params + [SamplingParams(temperature=0, max_tokens=24)] * len(UNCONSTRAINED)


@pytest.mark.parametrize("llm", ["xgrammar"], indirect=True)  # this checks the engine, not the backend
@pytest.mark.parametrize("engine_kwargs", [
    {"async_scheduling": True},
    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}},
], ids=["async-scheduling", "speculative"])
def test_async_scheduling_and_speculation_give_the_same_outputs(smollm2_folder: Path, llm: LLM,
                                                                 engine_kwargs: dict) -> None:
    prompts, params = _greedy_cases(llm)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    other = _llm(smollm2_folder, **engine_kwargs)
    try:
        got = other.generate(prompts, params, use_tqdm=False)
    finally:
        other.shutdown()
    assert [o.outputs[0].token_ids for o in got] == expected
    jsonschema.validate(json.loads(got[0].outputs[0].text), SCHEMAS["person"])


def test_constrained_requests_verify_drafts(smollm2_folder: Path, llm: LLM) -> None:
    """Constrained requests take speculative drafts: each verified position is masked by
    its grammar, so greedy outputs are those of plain constrained decoding, drafts are
    really verified and kept, and sampled outputs still satisfy the schema."""
    person = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.com"}
    spec = _llm(smollm2_folder, structured_outputs_config={"backend": llm.backend},  # type: ignore[attr-defined]
                speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    try:
        prompts = [_chat(llm, f"Repeat this JSON exactly: {json.dumps(person)}"),
                   _chat(llm, PROMPTS["array"]), _chat(llm, "Give me a phone number.")]
        constraints = [StructuredOutputsParams(json=SCHEMAS["person"]), StructuredOutputsParams(json=SCHEMAS["array"]),
                       StructuredOutputsParams(regex=REGEX)]
        greedy = [SamplingParams(temperature=0, max_tokens=80, structured_outputs=c) for c in constraints]
        want = llm.generate(prompts, greedy, use_tqdm=False)
        got = spec.generate(prompts, greedy, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
        assert json.loads(got[0].outputs[0].text)["name"] == person["name"]  # copied: the drafts' best case
        stats = spec.llm_engine.engine_core.make_stats().spec_decode
        assert stats is not None and stats.num_drafts > 0 and stats.num_accepted_tokens > 0
        sampled = [SamplingParams(temperature=0.8, max_tokens=80, structured_outputs=c) for c in constraints[:2]]
        for out in spec.generate(prompts[:2], sampled, use_tqdm=False):
            assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
            json.loads(out.outputs[0].text)
    finally:
        spec.shutdown()


@pytest.mark.parametrize("llm", ["xgrammar", "guidance"], indirect=True)
def test_async_scheduling_overlaps_the_grammar_with_the_forward(smollm2_folder: Path, llm: LLM,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Under --async-scheduling a constrained request no longer keeps steps synchronous:
    steps are planned while the one before runs, and their bitmask is filled after that
    step's tokens reach the grammars (sample_deferred). The outputs are those of
    synchronous steps, including requests whose grammar completes while the next step is
    already planned (choice) and unconstrained requests of the same batches."""
    prompts, params = _greedy_cases(llm)
    prompts.append(_chat(llm, "Is the sky blue?"))
    params.append(SamplingParams(temperature=0, max_tokens=20, structured_outputs=StructuredOutputsParams(
        choice=["yes", "no", "maybe so"])))
    sync = llm.generate(prompts, params, use_tqdm=False)
    expected = [o.outputs[0].token_ids for o in sync]
    # The bitmask filled into a buffer the executor provides (on a GPU: the in-process
    # worker's pinned memory, a numpy array): here a plain numpy array, the same path.
    buffers: list[int] = []

    def allocate(self: Any, nbytes: int) -> np.ndarray:
        buffers.append(nbytes)
        return np.zeros(nbytes, dtype=np.uint8)

    from forkless.executor.uniproc import UniProcExecutor

    monkeypatch.setattr(UniProcExecutor, "allocate_bitmask_buffer", allocate)
    other = _llm(smollm2_folder, async_scheduling=True,
                 structured_outputs_config={"backend": llm.backend})  # type: ignore[attr-defined]
    try:
        core = other.llm_engine.engine_core
        deferred = []
        sample = core.executor.sample_deferred
        core.executor.sample_deferred = lambda handle, bitmask: (deferred.append(bitmask), sample(handle, bitmask))
        # The deferred bitmasks are filled on the manager's fill thread, not the step loop.
        fill_threads = []
        manager = core._structured
        fill = manager._fill_groups
        manager._fill_groups = lambda *args: (fill_threads.append(threading.current_thread().name), fill(*args))
        # So is xgrammar's advance (its completion is told from the stop tokens), ahead of
        # the fill; guidance's stays on the step loop.
        advance_threads = []
        advance = manager._run_advance
        manager._run_advance = lambda todo, background=False: (
            advance_threads.extend([threading.current_thread().name] * len(todo)), advance(todo, background))[1]
        got = other.generate(prompts, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in got] == expected
        assert [(o.outputs[0].text, o.outputs[0].finish_reason) for o in got] == \
            [(o.outputs[0].text, o.outputs[0].finish_reason) for o in sync]
        assert "forkless-grammar-fill_0" in fill_threads, set(fill_threads)
        if llm.backend == "xgrammar":  # type: ignore[attr-defined]
            assert "forkless-grammar-fill_0" in advance_threads, set(advance_threads)
        else:
            assert not advance_threads, set(advance_threads)
        assert buffers and all(n % 4 == 0 for n in buffers)
        assert [o.outputs[0].finish_reason for o in got][:3] == ["stop"] * 3
        # Most steps overlapped: one per token of the longest constrained output, less the
        # first (nothing in flight then) and the few the end of a request makes synchronous.
        assert len(deferred) > len(got[0].outputs[0].token_ids) // 2, len(deferred)
        assert any(b is not None for b in deferred)
    finally:
        other.shutdown()


@pytest.mark.parametrize("llm", ["xgrammar"], indirect=True)  # this checks the executor, not the backend
def test_deferred_sampling_through_worker_processes(smollm2_folder: Path, llm: LLM,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With --distributed-executor-backend mp (the server's executor) constrained requests
    overlap too: the worker process launches a step's forward, and samples it when the
    engine core says its bitmask is ready (in shared memory); the outputs are those of
    synchronous steps. (The grammars on the engine core's threads here; the grammar
    process, the default with mp, tells the workers itself: test_grammar_process.py.)"""
    from forkless.executor.multiproc import MultiprocExecutor, StepHandle

    monkeypatch.setenv("FORKLESS_GRAMMAR_PROCESS", "0")

    prompts, params = _greedy_cases(llm)  # constrained and unconstrained requests together
    sync = llm.generate(prompts, params, use_tqdm=False)
    other = _llm(smollm2_folder, async_scheduling=True, distributed_executor_backend="mp",
                 structured_outputs_config={"backend": "xgrammar"})
    try:
        executor = other.llm_engine.engine_core.executor
        assert isinstance(executor, MultiprocExecutor) and executor.supports_deferred_sampling
        deferred = []
        sample = executor.sample_deferred
        executor.sample_deferred = lambda handle, bitmask: (deferred.append(bitmask is not None),
                                                            sample(handle, bitmask))
        # The bitmask is filled in shared memory the worker maps: it never crosses the socket.
        sent_frames = []
        send = executor._send
        executor._send = lambda rank, frames, copy=True: (sent_frames.append(len(frames)), send(rank, frames, copy))
        got = other.generate(prompts, params, use_tqdm=False)
        assert sent_frames and max(sent_frames) == 2, sent_frames
        assert [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in got] == \
            [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in sync]
        assert len(deferred) > len(got[0].outputs[0].token_ids) // 2 and any(deferred), deferred
        with pytest.raises(RuntimeError, match="not an uncollected step"):
            sample(StepHandle(10**6, id(executor)), None)
    finally:
        other.shutdown()
