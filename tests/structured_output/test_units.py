"""Structured outputs without a model: the request surface, the registry, the torch-free
checks and the worker's bitmask operation."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

from forkless import SamplingParams, StructuredOutputsParams
from forkless.plugins import RegistryError
from forkless.structured_output import (
    StructuredOutputBackend,
    StructuredOutputBackendRegistry,
    StructuredOutputsConfig,
    choose_backend,
)
from forkless.structured_output.bitmask import apply_token_bitmask, unpack_bitmask


def test_params_cross_the_socket_with_the_chosen_backend() -> None:
    so = StructuredOutputsParams(json={"type": "object"})
    so._backend = "guidance"
    params = SamplingParams(structured_outputs=so)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams)
    assert back.structured_outputs == so and back.structured_outputs._backend == "guidance"
    assert back.structured_outputs.kind == "json"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "exactly one of json, regex, choice, grammar or json_object=True; got none"),
    ({"regex": "a", "choice": ["b"]}, "got regex, choice"),
    ({"choice": []}, "choice=[] is invalid"),
    ({"regex": ""}, "regex='' is invalid"),
    ({"json": 3}, "json=3 is invalid"),
    ({"regex": "a", "structural_tag": "{}"}, "structural_tag is not supported"),
])
def test_bad_params_name_the_problem(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match="StructuredOutputsParams") as info:
        StructuredOutputsParams(**kwargs)
    assert message in str(info.value)


def test_guided_decoding_names_its_replacement() -> None:
    with pytest.raises(ValueError, match="structured_outputs=StructuredOutputsParams"):
        SamplingParams(guided_decoding={"json": {}})


def test_unknown_backend_lists_the_available_ones() -> None:
    with pytest.raises(RegistryError) as info:
        StructuredOutputBackendRegistry.resolve("outlines")
    assert "'outlines'" in str(info.value) and "auto, guidance, xgrammar" in str(info.value)
    from forkless.config import EngineArgs

    with pytest.raises(ValueError, match="--structured-outputs-config: unknown structured-output backend"):
        EngineArgs(structured_outputs_config={"backend": "outlines"})._structured_outputs_config()
    with pytest.raises(ValueError, match="unknown key"):
        StructuredOutputsConfig.from_json('{"backend": "xgrammar", "bakend": 1}')


def test_backends_are_imported_lazily_and_are_backends() -> None:
    import subprocess
    import sys

    code = ("import sys; from forkless.structured_output import StructuredOutputBackendRegistry as R, choose_backend, "
            "StructuredOutputsConfig as C; from forkless import StructuredOutputsParams as P; "
            "print(choose_backend(P(json={'type': 'object'}), C()), R.resolve('guidance').__name__, "
            "sorted({'torch', 'xgrammar', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # The API server's check imports neither torch nor xgrammar.
    assert out.split() == ["xgrammar", "GuidanceBackend", "[]"]
    for name in ("xgrammar", "guidance"):
        assert issubclass(StructuredOutputBackendRegistry.resolve(name), StructuredOutputBackend)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"json": '{"type": "objec'}, "not valid JSON"),
    ({"json": {"type": "foo"}}, "foo"),
    ({"json": {"type": "integer", "minimum": "x"}}, "minimum"),
    ({"json": {"type": "array", "uniqueItems": True}}, "uniqueItems"),
    ({"regex": "a(b"}, "unclosed group"),
    ({"grammar": "root ::= foo"}, "foo"),
    ({"grammar": 'start: "a"'}, "Lark"),
])
def test_xgrammar_checks_refuse_bad_constraints(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        choose_backend(StructuredOutputsParams(**kwargs), StructuredOutputsConfig(backend="xgrammar"))
    assert message in str(info.value)


def test_auto_falls_back_to_guidance_unless_told_not_to() -> None:
    lark = StructuredOutputsParams(grammar='start: "yes" | "no"')
    assert choose_backend(lark, StructuredOutputsConfig(backend="auto")) == "guidance"
    with pytest.raises(ValueError, match="Lark"):
        choose_backend(lark, StructuredOutputsConfig(backend="auto", disable_fallback=True))
    plain = StructuredOutputsParams(regex="[0-9]+")
    assert choose_backend(plain, StructuredOutputsConfig(backend="auto")) == "xgrammar"
    # Neither enforces uniqueItems: the error names it.
    with pytest.raises(ValueError, match="uniqueItems"):
        choose_backend(StructuredOutputsParams(json={"type": "array", "uniqueItems": True}),
                       StructuredOutputsConfig(backend="auto"))
    # Refused by both: each backend's reason, not the first one's advice to use the second.
    with pytest.raises(ValueError) as info:
        choose_backend(StructuredOutputsParams(grammar='?start: "a"'), StructuredOutputsConfig(backend="auto"))
    message = str(info.value)
    assert message.startswith("no structured-outputs backend takes this constraint: xgrammar: ")
    assert "; guidance: " in message


def test_a_constraint_sent_again_is_not_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """An application sends the same schema with every request: its check (llguidance
    building the grammar) runs once, and a bad one is refused every time alike."""
    import llguidance

    calls: list[str] = []
    check = llguidance.LLMatcher.validate_grammar_with_warnings
    monkeypatch.setattr(llguidance.LLMatcher, "validate_grammar_with_warnings",
                        lambda grammar: (calls.append(grammar), check(grammar))[1])
    config = StructuredOutputsConfig(backend="xgrammar")  # (auto checks a bad one twice: each backend)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 7013}}}
    for _ in range(3):
        assert choose_backend(StructuredOutputsParams(json=schema), config) == "xgrammar"
    assert len(calls) == 1
    bad = StructuredOutputsParams(json={"type": "integer", "minimum": "seven thousand"})
    messages = []
    for _ in range(2):
        with pytest.raises(ValueError) as info:
            choose_backend(bad, config)
        messages.append(str(info.value))
    assert len(calls) == 2 and messages[0] == messages[1] and "minimum" in messages[0]
    # A long one too (remembered by a digest, not by its text).
    long_regex = "a{1,3}" + "b" * (64 << 10)
    for _ in range(2):
        choose_backend(StructuredOutputsParams(regex=long_regex), config)
    assert len(calls) == 3


def _reference(logits: torch.Tensor, bitmask: np.ndarray, rows: list[int]) -> torch.Tensor:
    out = logits.clone()
    vocab = logits.shape[1]
    for i, row in enumerate(rows):
        for t in range(vocab):
            word = t // 32
            allowed = word < bitmask.shape[1] and (int(bitmask[i, word]) >> (t % 32)) & 1
            if not allowed:
                out[row, t] = float("-inf")
    return out


@pytest.mark.parametrize("vocab", [64, 70, 100])
def test_bitmask_masks_exactly_the_disallowed_tokens(vocab: int) -> None:
    gen = np.random.default_rng(0)
    logits = torch.randn(5, vocab)
    words = (min(vocab, 96) + 31) // 32  # vocab 100: a bitmask narrower than the logits
    bitmask = gen.integers(-2**31, 2**31, size=(3, words), dtype=np.int64).astype(np.int32)
    rows = [4, 0, 2]
    expected = _reference(logits, bitmask, rows)
    got = logits.clone()
    apply_token_bitmask(got, bitmask, rows)
    assert torch.equal(got, expected)
    # Every row, in order: the in-place path.
    full = gen.integers(-2**31, 2**31, size=(5, words), dtype=np.int64).astype(np.int32)
    got = logits.clone()
    apply_token_bitmask(got, full, [0, 1, 2, 3, 4])
    assert torch.equal(got, _reference(logits, full, [0, 1, 2, 3, 4]))


def test_a_steps_bitmask_maps_its_rows_to_the_logits_rows() -> None:
    """StepBitmask.from_plan: a step whose rows are all constrained, in the plan's order and
    without drafts, masks row i with bitmask row i (the fast path, also with logits padded
    past the step's rows); otherwise each constrained row gets its request's row."""
    from forkless.protocol.step import ScheduledRequest, SchedulerOutput
    from forkless.structured_output.bitmask import StepBitmask

    gen = np.random.default_rng(1)
    vocab = 96
    rows = [ScheduledRequest(f"r{i}", [1], 10, [], False, True) for i in range(4)]
    bitmask = gen.integers(-2**31, 2**31, size=(4, 3), dtype=np.int64).astype(np.int32)
    logits = torch.randn(6, vocab)  # two padding rows past the step's four

    def step(ids: list[str], mask: np.ndarray) -> StepBitmask:
        plan = SchedulerOutput(scheduled_requests=rows, structured_output_request_ids=ids,
                               grammar_bitmask=bytearray(mask.tobytes()))
        return StepBitmask.from_plan(plan, rows)

    in_order = step(["r0", "r1", "r2", "r3"], bitmask)
    assert in_order.in_order
    got = logits.clone()
    in_order.apply_sampled(got)
    assert torch.equal(got, _reference(logits, bitmask, [0, 1, 2, 3]))
    # Two constrained rows, in another order than the step's: mapped by request.
    mapped = step(["r3", "r1"], bitmask[:2])
    assert not mapped.in_order
    got = logits.clone()
    mapped.apply_sampled(got)
    assert torch.equal(got, _reference(logits, bitmask[:2], [3, 1]))


def test_bitmask_unpacks_to_the_disallowed_tokens() -> None:
    gen = np.random.default_rng(1)
    bitmask = gen.integers(-2**31, 2**31, size=(4, 3), dtype=np.int64).astype(np.int32)
    cpu = unpack_bitmask(bitmask, 100, torch.device("cpu"))
    # What the device path computes (shifts), on the CPU; past the bitmask: disallowed.
    shifts = torch.arange(32, dtype=torch.int32)
    manual = ((torch.from_numpy(bitmask).unsqueeze(-1) >> shifts) & 1).view(4, 96) == 0
    assert torch.equal(cpu[:, :96], manual) and bool(cpu[:, 96:].all())


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_a_steps_rows_filled_at_once_equal_one_by_one(smollm2_folder, backend: str) -> None:
    import json

    from forkless.tokenizers.loading import load_tokenizer
    from tests.structured_output.schemas import SCHEMAS

    tokenizer = load_tokenizer(smollm2_folder)
    instance = StructuredOutputBackendRegistry.resolve(backend)(tokenizer, 49152, [2], StructuredOutputsConfig())
    specs = [json.dumps(s) for s in SCHEMAS.values()] * 8  # 32 rows: xgrammar's threaded path
    grammars = [instance.compile_grammar("json", spec) for spec in specs]
    prefix = tokenizer.encode('{"', add_special_tokens=False)
    for grammar in grammars[::2]:  # half of them one step further
        assert grammar.accept_tokens("r", prefix[:1])
    at_once = instance.allocate_token_bitmask(40)
    one_by_one = instance.allocate_token_bitmask(40)
    indices = list(range(3, 35))
    instance.fill_bitmasks(grammars, at_once, indices)
    for grammar, index in zip(grammars, indices):
        grammar.fill_bitmask(one_by_one, index)
    assert np.array_equal(at_once, one_by_one)
    assert not np.array_equal(at_once[3], at_once[4])  # the rows really differ
    if backend == "xgrammar":
        # Rows that cost little fill on one thread; costly ones on xgrammar's threads:
        # the same rows either way.
        assert instance._row_seconds > 0
        instance._row_seconds = 1.0
        threaded = instance.allocate_token_bitmask(40)
        instance.fill_bitmasks(grammars, threaded, indices)
        assert np.array_equal(threaded, one_by_one)


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_a_closed_object_allows_only_the_stop_token_and_completes_with_it(smollm2_folder, backend: str) -> None:
    """Both backends as vLLM's: a JSON object whose closing brace leaves nothing to add is
    complete only once the stop token is taken (the output ends with it), and a stop
    token taken (as a speculative draft is) rolls back; anything else after it is refused."""
    from forkless.tokenizers.loading import load_tokenizer

    tokenizer = load_tokenizer(smollm2_folder)
    instance = StructuredOutputBackendRegistry.resolve(backend)(tokenizer, 49152, [2], StructuredOutputsConfig())
    spec = ('{"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}, "required": ["a"], '
            '"additionalProperties": false}')
    grammar = instance.compile_grammar("json", spec)
    text = tokenizer.encode('{"a": "xy"}', add_special_tokens=False)
    assert grammar.validate_tokens([*text, 2]) == [*text, 2]
    assert grammar.accept_tokens("r", text) and not grammar.is_terminated()
    row = instance.allocate_token_bitmask(1)
    grammar.fill_bitmask(row, 0)
    assert [t for t in range(49152) if row[0, t // 32] >> (t % 32) & 1] == [2]
    assert grammar.accept_tokens("r", [2]) and grammar.is_terminated()
    grammar.rollback(1)
    assert not grammar.is_terminated()
    assert not grammar.accept_tokens("r", tokenizer.encode(".", add_special_tokens=False))


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_a_steps_grammars_advance_at_once_as_one_by_one(smollm2_folder, backend: str) -> None:
    """A step's tokens advance the grammars in one call per backend: what each accepts
    and which are complete afterwards (stop token taken) are what the grammars say one
    by one, refused tokens included (xgrammar's batch path then reads its result row by
    row)."""
    from forkless.tokenizers.loading import load_tokenizer

    tokenizer = load_tokenizer(smollm2_folder)
    cls = StructuredOutputBackendRegistry.resolve(backend)
    instance = cls(tokenizer, 49152, [2], StructuredOutputsConfig())
    spec = '["yes please", "no thanks"]'
    batched = [instance.compile_grammar("choice", spec) for _ in range(32)]  # xgrammar's batch path
    single = [instance.compile_grammar("choice", spec) for _ in range(32)]
    good = tokenizer.encode("yes please", add_special_tokens=False)
    bad = tokenizer.encode("maybe", add_special_tokens=False)[:1]
    # Eight grammars one token short of complete: xgrammar completes on the stop token
    # after the text, guidance on the text's last token.
    probe = instance.compile_grammar("choice", spec)
    probe.accept_tokens("r", good)
    pre, last = (good[:1], good[1:2]) if probe.is_terminated() else (good, [2])
    for grammars in (batched, single):
        for grammar in grammars[:8]:
            assert grammar.accept_tokens("r", pre)
    tokens = [last] * 8 + [good[:1]] * 12 + [bad] * 12

    def step(rows: list[list[int]]) -> tuple[list[bool], list[bool]]:
        accepted = instance.accept_tokens_batch(batched, ["r"] * 32, rows)
        kept = [i for i, ok in enumerate(accepted) if ok]
        done = instance.terminated_batch([batched[i] for i in kept], [rows[i] for i in kept])
        terminated = [False] * 32
        for i, d in zip(kept, done):
            terminated[i] = d
        return accepted, terminated

    accepted, terminated = step(tokens)
    expected = [g.accept_tokens("r", t) for g, t in zip(single, tokens)]
    assert accepted == expected == [True] * 20 + [False] * 12
    assert terminated == [g.is_terminated() and ok for g, ok in zip(single, expected)] == [True] * 8 + [False] * 24
    # Every token accepted (the usual, masked step): the same one-call answer.
    assert step([[good[1]]] * 32)[0][8:20] == [True] * 12
    # In the background (the fill thread beside the step loop): the same answers.
    fresh = [instance.compile_grammar("choice", spec) for _ in range(32)]
    assert instance.accept_tokens_batch(fresh, ["r"] * 32, [good[:1]] * 16 + [bad] * 16,
                                        background=True) == [True] * 16 + [False] * 16
    instance.destroy()


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_a_verifying_request_gets_a_bitmask_row_per_position(smollm2_folder, backend: str) -> None:
    """Speculative drafts of a constrained request: row j is what the grammar allows after
    the first j drafts; after a draft it refuses, the rows repeat the one that refuses it;
    a draft that would complete the grammar is refused there too (its stop token may only
    come last); and the grammar is left where it was."""
    import time

    from forkless.protocol.step import ScheduledRequest, SchedulerOutput
    from forkless.structured_output.manager import StructuredOutputManager
    from forkless.tokenizers.loading import load_tokenizer

    tokenizer = load_tokenizer(smollm2_folder)
    manager = StructuredOutputManager(StructuredOutputsConfig(backend=backend), str(smollm2_folder), 49152, [2])
    try:
        manager.submit("r", StructuredOutputsParams(choice=["yes please", "no thanks"]))
        deadline = time.monotonic() + 60
        while not manager.poll()[0]:
            assert time.monotonic() < deadline
            manager.wait(0.1)
        good = tokenizer.encode("yes please", add_special_tokens=False)
        bad = tokenizer.encode("no", add_special_tokens=False)[:1]

        def plan(drafts: list[int]) -> np.ndarray:
            step = SchedulerOutput(scheduled_requests=[ScheduledRequest(
                "r", [7] + drafts, 10, [], False, True, num_spec_tokens=len(drafts))])
            manager.fill_bitmask(step)
            assert step.structured_output_request_ids == ["r"]
            return np.frombuffer(step.grammar_bitmask, dtype=np.int32).reshape(1 + len(drafts), -1)

        def allows(row: np.ndarray, token: int) -> bool:
            return bool((int(row[token // 32]) >> (token % 32)) & 1)

        first = plan([])[0].copy()
        assert allows(first, good[0]) and allows(first, bad[0])
        rows = plan(good[:1])
        assert allows(rows[0], good[0]) and allows(rows[1], good[1]) and not allows(rows[1], bad[0])
        # The draft that completes the grammar (xgrammar: the stop token after the text;
        # guidance: the text's last token) is refused where it would be verified: the
        # rows from there on repeat the one before.
        rows = plan(good + [2])
        assert len(rows) == len(good) + 2 and np.array_equal(rows[-1], rows[-2])
        rows = plan(good[:1] + bad + good[1:])  # a refused draft in second place
        assert not allows(rows[1], bad[0]) and np.array_equal(rows[2], rows[1])
        assert np.array_equal(plan([])[0], first)  # nothing stayed accepted
    finally:
        manager.shutdown()


@pytest.mark.parametrize("disable_fallback", [False, True])
def test_auto_falls_back_when_xgrammar_refuses_what_its_check_passed(smollm2_folder, disable_fallback: bool) -> None:
    """auto's torch-free check reads an EBNF grammar for xgrammar with llguidance, which
    takes an empty alternative that xgrammar's parser refuses: the engine core then
    compiles it with guidance (auto's next choice), unless fallback is disabled."""
    import time

    from forkless.structured_output.manager import StructuredOutputManager
    from forkless.structured_output.registry import choose_backend

    config = StructuredOutputsConfig(backend="auto")
    params = StructuredOutputsParams(grammar='root ::= "yes" | ', disable_fallback=disable_fallback)
    params._backend = choose_backend(params, config)
    assert params._backend == "xgrammar"
    manager = StructuredOutputManager(config, str(smollm2_folder), 49152, [2])
    try:
        manager.submit("r", params)
        deadline = time.monotonic() + 60
        while True:
            ready, failed = manager.poll()
            if ready or failed:
                break
            assert time.monotonic() < deadline
            manager.wait(0.1)
        if disable_fallback:
            assert ready == [] and len(failed) == 1 and "xgrammar cannot compile the grammar" in failed[0][1]
        else:
            assert ready == ["r"] and failed == []
            assert type(manager._backend_of["r"]).__name__ == "GuidanceBackend"
    finally:
        manager.shutdown()


def _three_choice_grammars(smollm2_folder, ids: list[str]):
    """An xgrammar manager holding a ready choice grammar ("yes please" / "no thanks") for
    each id; ``(manager, tokens of "yes please", a token the grammars refuse)``."""
    import time

    from forkless.structured_output.manager import StructuredOutputManager
    from forkless.tokenizers.loading import load_tokenizer

    tokenizer = load_tokenizer(smollm2_folder)
    manager = StructuredOutputManager(StructuredOutputsConfig(backend="xgrammar"), str(smollm2_folder), 49152, [2])
    for rid in ids:
        manager.submit(rid, StructuredOutputsParams(choice=["yes please", "no thanks"]))
    deadline = time.monotonic() + 60
    ready: list[str] = []
    while len(ready) < len(ids):
        assert time.monotonic() < deadline
        manager.wait(0.1)
        ready += manager.poll()[0]
    return (manager, tokenizer.encode("yes please", add_special_tokens=False),
            tokenizer.encode("maybe", add_special_tokens=False)[:1])


def test_a_deferred_advance_runs_on_the_fill_thread_and_reports_refusals_a_step_later(smollm2_folder) -> None:
    """Under --async-scheduling, xgrammar's grammars take a step's tokens on the fill
    thread, ahead of the next bitmask: completion is told at once from the stop token,
    the next rows are those of the advanced grammars, and a refused token (a backend
    fault) fails its request at the next accept."""
    import threading

    from forkless.protocol.step import EngineCoreOutput, ScheduledRequest, SchedulerOutput

    ids = ["going", "refused", "complete"]
    manager, good, bad = _three_choice_grammars(smollm2_folder, ids)
    try:
        # "complete" has its text already: its next token is the stop token.
        assert manager.accept([EngineCoreOutput("complete", good)]) == ([], [])
        threads = []
        run = manager._run_advance
        manager._run_advance = lambda todo, background=False: (
            threads.append((threading.current_thread().name, background)), run(todo, background))[1]
        # The next step is planned while this one runs, then this one's tokens come.
        plan = SchedulerOutput(scheduled_requests=[ScheduledRequest(rid, [0], 10, [], False, True) for rid in ids])
        manager.defer(plan)
        outputs = [EngineCoreOutput("going", good[:1]), EngineCoreOutput("refused", bad),
                   EngineCoreOutput("complete", [2])]
        assert manager.accept(outputs, defer_advance=True) == (["complete"], [])
        assert not threads  # nothing advanced yet
        manager.start_deferred_fill(plan)
        rows = np.frombuffer(manager.take_deferred_fill(), dtype=np.int32).reshape(3, -1)
        assert threads == [("forkless-grammar-fill_0", True)]

        def allows(row: np.ndarray, token: int) -> bool:
            return bool((int(row[token // 32]) >> (token % 32)) & 1)

        assert allows(rows[0], good[1]) and not allows(rows[0], good[0])  # advanced past good[0]
        assert (rows[2] == -1).all()  # complete: gone, its row allows everything
        complete, rejected = manager.accept([EngineCoreOutput("going", good[1:2])])
        assert complete == [] and [rid for rid, _ in rejected] == ["refused"]
        assert str(bad) in rejected[0][1] and "refused" in rejected[0][1]
        assert manager.accept([EngineCoreOutput("refused", good[:1])]) == ([], [])  # forgotten
    finally:
        manager.shutdown()


def test_the_grammar_processs_path_advances_kept_tokens_and_fills_its_own_rows(smollm2_folder) -> None:
    """What a grammar process does with a deferred fill (``advance_kept``, then
    ``fill_deferred_rows_now`` on its own thread): a complete grammar leaves at once, a
    refused token is reported by ``take_refused``, and only the rows named are written
    (another process writes the others), a request without a grammar there allowing
    everything."""
    manager, good, bad = _three_choice_grammars(smollm2_folder, ["going", "refused", "complete"])
    try:
        manager.advance_kept([("complete", good)])
        manager.advance_kept([("going", good[:1]), ("refused", bad), ("complete", [2]), ("unknown", [5])])
        refused = manager.take_refused()
        assert [rid for rid, _ in refused] == ["refused"] and str(bad) in refused[0][1]
        assert manager.completion_stop_ids("complete") is None  # gone: it completed
        words = (49152 + 31) // 32
        # Rows 1 and 3 of a 5-row bitmask are this process's; the rest are left alone.
        buffer = manager._rows(5)
        buffer[:] = 7
        manager.fill_deferred_rows_now(5, [(1, "going"), (3, "complete")])
        rows = np.frombuffer(manager._buffer, dtype=np.int32).reshape(5, words)

        def allows(row: np.ndarray, token: int) -> bool:
            return bool((int(row[token // 32]) >> (token % 32)) & 1)

        assert allows(rows[1], good[1]) and not allows(rows[1], good[0])  # advanced past good[0]
        assert (rows[3] == -1).all()  # complete: its row allows everything
        assert (rows[[0, 2, 4]] == 7).all()
    finally:
        manager.shutdown()
