"""Speculative decoding in the engine (``ngram``): greedy outputs are token for token
those of plain decoding, whatever the drafts, and the drafts are really verified."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkless.entrypoints.llm import LLM
from forkless.sampling_params import SamplingParams
from tests.engine.tiny_models import make_model

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
# Repetitive prompts, so that the tiny model's greedy continuations repeat too and the
# drafts get accepted; one that is not.
PROMPTS = [
    "the cat sat on the mat the cat sat on the mat the cat sat on",
    "a b c d a b c d a b c d a b c d a b",
    "Paris is the capital of France. Paris is the capital of",
    "one two three four five six seven",
]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny-llama-spec"), "llama")


def _tokens(llm: LLM, prompts: list[str], params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference(llama_dir: Path) -> LLM:
    llm = LLM(str(llama_dir), max_model_len=256)
    yield llm
    llm.shutdown()


@pytest.mark.parametrize("executor", ["uni", "mp"])
def test_greedy_ngram_equals_plain_decoding(llama_dir: Path, reference: LLM, executor: str) -> None:
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    expected = _tokens(reference, PROMPTS, params)
    llm = LLM(str(llama_dir), max_model_len=256, speculative_config=NGRAM, distributed_executor_backend=executor)
    try:
        assert _tokens(llm, PROMPTS, params) == expected
        # Again, now from the prefix cache: the same.
        assert _tokens(llm, PROMPTS, params) == expected
        # This random model's guesses are kept by chance only (test_drafts_are_kept_where_
        # the_output_repeats checks kept drafts); its drafts are still proposed and scored.
        stats = llm.llm_engine.engine_core.make_stats().spec_decode
        assert stats is not None and stats.num_drafts > 0
        assert 0 <= stats.num_accepted_tokens <= stats.num_draft_tokens
        assert len(stats.num_accepted_tokens_per_pos) == 4
        assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def echo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny-llama-echo"), "llama", echo=True)


@pytest.mark.parametrize("executor,async_scheduling", [("uni", False), ("mp", False), ("uni", True), ("mp", True)])
def test_drafts_are_kept_where_the_output_repeats(echo_dir: Path, executor: str, async_scheduling: bool) -> None:
    """A model whose greedy output repeats its last token: prompt lookup guesses it, the
    drafts are verified and kept, and the output is still exactly plain decoding's, also
    where ``max_tokens`` lands inside a kept run."""
    plain = LLM(str(echo_dir), max_model_len=256)
    try:
        want = {n: _tokens(plain, PROMPTS, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
                for n in (1, 2, 5, 7, 32)}
    finally:
        plain.shutdown()
    llm = LLM(str(echo_dir), max_model_len=256, speculative_config=NGRAM, distributed_executor_backend=executor,
              async_scheduling=async_scheduling)
    try:
        for n, expected in want.items():
            assert _tokens(llm, PROMPTS, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)) == expected
        stats = llm.llm_engine.engine_core.make_stats().spec_decode
        assert stats is not None and stats.num_drafts > 0
        assert 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
        assert len(stats.num_accepted_tokens_per_pos) == 4 and stats.num_accepted_tokens_per_pos[0] > 0
        assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def spec_llm(llama_dir: Path) -> LLM:
    llm = LLM(str(llama_dir), max_model_len=256, speculative_config=NGRAM)
    yield llm
    llm.shutdown()


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7, 13])
def test_max_tokens_inside_an_accepted_run(spec_llm: LLM, reference: LLM, max_tokens: int) -> None:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    got = _tokens(spec_llm, PROMPTS, params)
    assert got == _tokens(reference, PROMPTS, params)
    assert all(len(t) == max_tokens for t in got)


def test_stops_inside_an_accepted_run(spec_llm: LLM, reference: LLM) -> None:
    plain = [o.outputs[0] for o in reference.generate(
        PROMPTS[:2], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True), use_tqdm=False)]
    text = plain[1].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip(), text
    # Stop on a token that comes after a few accepted ones, and on a stop string.
    params = [SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop_token_ids=[plain[0].token_ids[9]]),
              SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop=[stop])]
    got = [o.outputs[0] for o in spec_llm.generate(PROMPTS[:2], params, use_tqdm=False)]
    want = [o.outputs[0] for o in reference.generate(PROMPTS[:2], params, use_tqdm=False)]
    for g, w in zip(got, want):
        assert (list(g.token_ids), g.text, g.finish_reason, g.stop_reason) == (
            list(w.token_ids), w.text, w.finish_reason, w.stop_reason)
    assert got[0].finish_reason == "stop" and got[0].stop_reason == plain[0].token_ids[9]
    assert got[1].finish_reason == "stop" and got[1].stop_reason == stop


def test_mixed_batch_some_requests_do_not_speculate(spec_llm: LLM, reference: LLM) -> None:
    """Logprobs, penalties and min_tokens keep a request out of speculation; the batch mixes."""
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=2),
              SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, repetition_penalty=1.3),
              SamplingParams(max_tokens=24, temperature=0, min_tokens=5)]
    got = spec_llm.generate(PROMPTS, params, use_tqdm=False)
    want = reference.generate(PROMPTS, params, use_tqdm=False)
    for g, w in zip(got, want):
        assert list(g.outputs[0].token_ids) == list(w.outputs[0].token_ids)
    lp_got, lp_want = got[1].outputs[0].logprobs, want[1].outputs[0].logprobs
    assert [sorted(e) for e in lp_got] == [sorted(e) for e in lp_want]


def test_sampled_requests_speculate_and_finish(spec_llm: LLM) -> None:
    params = [SamplingParams(max_tokens=30, temperature=0.8, ignore_eos=True),
              SamplingParams(max_tokens=30, temperature=0.8, top_k=5, top_p=0.9, ignore_eos=True)]
    before = spec_llm.llm_engine.engine_core.make_stats().spec_decode.num_drafts
    outs = _tokens(spec_llm, PROMPTS * 2, params * len(PROMPTS))
    assert all(len(t) == 30 for t in outs)
    assert spec_llm.llm_engine.engine_core.make_stats().spec_decode.num_drafts > before


@pytest.mark.parametrize("config,needle", [
    ({"method": "medusa9", "num_speculative_tokens": 2}, "registered: draft_model, ngram"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": -1}, "prompt_lookup_max"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "k": 1}', "'k'"),
])
def test_bad_configs_fail_before_the_model_loads(llama_dir: Path, config: object, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        LLM(str(llama_dir), max_model_len=256, speculative_config=config)
    assert needle in str(info.value)


def test_a_proposer_path_that_does_not_import_names_the_flag(llama_dir: Path) -> None:
    with pytest.raises(ImportError, match=r"^--speculative-config: cannot import 'no_such_pkg.mod:Proposer'"):
        LLM(str(llama_dir), max_model_len=256, speculative_config={"method": "no_such_pkg.mod:Proposer",
                                                                   "num_speculative_tokens": 2})
    with pytest.raises(TypeError, match=r"^--speculative-config: speculative method 'collections:OrderedDict'"):
        LLM(str(llama_dir), max_model_len=256, speculative_config={"method": "collections:OrderedDict",
                                                                   "num_speculative_tokens": 2})


@pytest.mark.parametrize("executor", ["uni", "mp"])
def test_async_scheduling_with_ngram_equals_plain_decoding(llama_dir: Path, reference: LLM, executor: str) -> None:
    """With --async-scheduling the drafts are still verified (steps with drafts wait for
    the step before), the steps without drafts overlap, and greedy outputs do not change;
    a mixed batch (logprobs, penalties keep requests from speculating) too."""
    params = [SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=2),
              SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, repetition_penalty=1.3)]
    want = reference.generate(PROMPTS, params, use_tqdm=False)
    llm = LLM(str(llama_dir), max_model_len=256, speculative_config=NGRAM, async_scheduling=True,
              distributed_executor_backend=executor)
    try:
        core = llm.llm_engine.engine_core
        assert core.async_scheduling  # not silently turned off
        for _ in range(2):  # the second time from the prefix cache
            got = llm.generate(PROMPTS, params, use_tqdm=False)
            assert [list(o.outputs[0].token_ids) for o in got] == [list(o.outputs[0].token_ids) for o in want]
        assert [sorted(e) for e in got[2].outputs[0].logprobs] == [sorted(e) for e in want[2].outputs[0].logprobs]
        # Lengths landing inside an accepted run, and sampled requests, finish too.
        short = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
        assert _tokens(llm, PROMPTS, short) == _tokens(reference, PROMPTS, short)
        sampled = _tokens(llm, PROMPTS, SamplingParams(max_tokens=30, temperature=0.8, ignore_eos=True))
        assert all(len(t) == 30 for t in sampled)
        # Every prompt greedy and speculating for 48 tokens (drafts kept by chance only
        # here: test_drafts_are_kept_where_the_output_repeats runs kept drafts async too).
        greedy = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
        assert _tokens(llm, PROMPTS, greedy) == _tokens(reference, PROMPTS, greedy)
        stats = core.make_stats().spec_decode
        assert stats is not None and stats.num_drafts > 0
    finally:
        llm.shutdown()
