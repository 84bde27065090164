"""The engine core's side: a request waits for its grammar without holding up the others,
and a grammar that fails to compile in the engine core fails its own request only.

A backend given by class path (``--structured-outputs-config``'s ``backend``) wraps
guidance with a slow or failing compilation; the tiny random Llama keeps this fast.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from forkless import LLM, SamplingParams, StructuredOutputsParams
from forkless.structured_output.backend_guidance import GuidanceBackend

pytestmark = pytest.mark.slow

# Released by the test: until then, compiling "wait" blocks the compile thread.
RELEASE = threading.Event()


class GatedBackend(GuidanceBackend):
    """Guidance, except that the choice ["wait"] compiles only once RELEASE is set, and the
    choice ["fail"] does not compile (as if the backend found a problem the API-server
    check missed)."""

    def compile_grammar(self, request_type, spec, *, any_whitespace=True):
        if spec == '["wait"]':
            assert RELEASE.wait(60)
        if spec == '["fail"]':
            raise ValueError("this backend cannot compile 'fail'")
        return super().compile_grammar(request_type, spec, any_whitespace=any_whitespace)


@pytest.fixture(scope="module")
def llm(tiny_llama: Path):
    engine = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24,
                 structured_outputs_config={"backend": f"{__name__}:GatedBackend"})
    yield engine
    engine.shutdown()


def test_a_request_waits_for_its_grammar_while_the_others_run(llm: LLM) -> None:
    engine = llm.llm_engine
    RELEASE.clear()
    engine.add_request("constrained", "Say it:", SamplingParams(
        max_tokens=5, structured_outputs=StructuredOutputsParams(choice=["wait"])))
    engine.add_request("plain", "Hello", SamplingParams(max_tokens=5, ignore_eos=True))
    finished: dict[str, str] = {}
    while "plain" not in finished:
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].text
    # The plain request finished while the constrained one's grammar was still compiling.
    assert "constrained" not in finished and engine.has_unfinished_requests()
    RELEASE.set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].text
    assert finished["constrained"] == "wait"


def test_a_grammar_that_fails_in_the_engine_core_fails_its_request_only(llm: LLM) -> None:
    check_a_failed_compile_fails_its_request_only(llm)


def check_a_failed_compile_fails_its_request_only(llm: LLM) -> None:
    """With GatedBackend: the choice ["fail"] fails its own request (a ValueError of the
    step that reports it, offline), the others finish, and the engine goes on."""
    engine = llm.llm_engine
    engine.add_request("bad", "x", SamplingParams(max_tokens=5, structured_outputs=StructuredOutputsParams(
        choice=["fail"])))
    engine.add_request("good", "Hello", SamplingParams(max_tokens=3, ignore_eos=True))
    errors, done = [], []
    while engine.has_unfinished_requests():
        try:
            done += [o.request_id for o in engine.step() if o.finished]
        except ValueError as exc:  # offline, a failed request is a ValueError of the step
            errors.append(str(exc))
    assert len(errors) == 1 and "request 'bad'" in errors[0] and "cannot compile 'fail'" in errors[0]
    assert done == ["good"]
    # The engine goes on, constrained requests included.
    out = llm.generate(["x"], SamplingParams(max_tokens=5, structured_outputs=StructuredOutputsParams(
        choice=["yes", "no"])), use_tqdm=False)
    assert out[0].outputs[0].text in ("yes", "no")


def test_a_failed_request_of_n_completions_leaves_nothing_unfinished(llm: LLM) -> None:
    """Each of an ``n=2`` request's completions is an engine-core request of its own
    (``0_both``, ``1_both``): when the engine core fails them, the request they belong to
    is gone too, so ``has_unfinished_requests()`` turns False instead of stepping an idle
    engine forever."""
    engine = llm.llm_engine
    engine.add_request("both", "x", SamplingParams(n=2, max_tokens=5, structured_outputs=StructuredOutputsParams(
        choice=["fail"])))
    errors = []
    for _ in range(200):  # a few steps; never a spin
        if not engine.has_unfinished_requests():
            break
        try:
            assert not [o for o in engine.step() if o.request_id == "both"]
        except ValueError as exc:
            errors.append(str(exc))
    assert not engine.has_unfinished_requests() and engine.get_num_unfinished_requests() == 0
    assert errors and all("cannot compile 'fail'" in e for e in errors)
    assert "'0_both'" in " ".join(errors) and "'1_both'" in " ".join(errors)


def test_a_step_that_raises_for_a_failed_request_loses_no_other_output(llm: LLM,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure reported in the step that also finishes another request (its grammar's
    compile thread was slow, say) raises; the other request's output comes with the next
    call instead of being dropped with the exception."""
    engine = llm.llm_engine
    real = engine.engine_core.take_request_errors
    calls: list[int] = []

    def errors() -> list[tuple[str, str]]:
        calls.append(1)
        return real() + ([("ghost", "its grammar failed")] if len(calls) == 1 else [])

    monkeypatch.setattr(engine.engine_core, "take_request_errors", errors)
    engine.add_request("quick", "Hello", SamplingParams(max_tokens=1, ignore_eos=True))
    with pytest.raises(ValueError, match="request 'ghost': its grammar failed"):
        engine.step()  # the step that finished "quick"
    assert engine.has_unfinished_requests()
    outs = engine.step()
    assert [(o.request_id, o.finished) for o in outs] == [("quick", True)]
    assert len(outs[0].outputs[0].token_ids) == 1
    assert not engine.has_unfinished_requests()
