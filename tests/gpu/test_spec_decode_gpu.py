"""Speculative decoding (``ngram``) on the GPU: greedy outputs equal plain decoding with
the Triton backend, eager and with verification steps replayed in CUDA graphs (rows padded
to ``1 + k`` tokens), also with ``--async-scheduling``, and sampled requests still speculate."""

from __future__ import annotations

import random

import pytest

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def _prompts() -> list[dict]:
    # Repeating token patterns (the random model's greedy output loops too, so drafts are
    # accepted), of different lengths so that rows have different draft counts.
    rng = random.Random(1)
    prompts = []
    for n in (3, 5, 8, 13, 21, 4):
        unit = [rng.randrange(100, 150000) for _ in range(n)]
        prompts.append({"prompt_token_ids": (unit * (60 // n + 2))[: rng.randint(30, 90)]})
    return prompts


def _run(model, max_tokens: int = 40, **engine_args) -> tuple[list[list[int]], object]:
    from forkless import LLM, SamplingParams

    llm = LLM(str(model), dtype="float32", max_model_len=256, kv_cache_memory=1 << 30,
              max_num_seqs=8, attention_backend="triton", **engine_args)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        prompts = _prompts()
        # One alone (batch 1), then the rest together (mixed draft counts, some rows none).
        outs = llm.generate(prompts[:1], params, use_tqdm=False)
        outs += llm.generate(prompts[1:], params, use_tqdm=False)
        runner = llm.llm_engine.engine_core.executor.worker.model_runner
        stats = llm.llm_engine.engine_core.make_stats().spec_decode
        return [list(o.outputs[0].token_ids) for o in outs], (runner, stats)
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def reference(real_size_model):
    return _run(real_size_model, enforce_eager=True)[0]


@pytest.mark.parametrize("eager,async_scheduling", [(True, False), (False, False), (False, True)],
                         ids=["eager", "graphs", "graphs-async"])
def test_ngram_greedy_equals_plain_decoding(real_size_model, reference, eager, async_scheduling):
    tokens, (runner, stats) = _run(real_size_model, enforce_eager=eager, speculative_config=NGRAM,
                                   async_scheduling=async_scheduling)
    assert tokens == reference
    assert stats is not None and stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    if not eager:
        # The verification steps really ran in their graphs.
        assert runner.graphs is not None and runner.graphs.spec_replays > 0


def test_verification_graph_near_max_model_len(real_size_model):
    # Rows whose padded verification would pass max_model_len run eagerly instead; the
    # outputs still equal plain decoding up to the length limit.
    from forkless import LLM, SamplingParams

    prompt = {"prompt_token_ids": [11, 12, 13, 14] * 55}  # 220 tokens, 36 left
    params = SamplingParams(temperature=0.0, max_tokens=36, ignore_eos=True)
    outs = []
    for spec in (None, NGRAM):
        llm = LLM(str(real_size_model), dtype="float32", max_model_len=256, kv_cache_memory=1 << 30,
                  max_num_seqs=4, attention_backend="triton", speculative_config=spec)
        try:
            outs.append(list(llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids))
        finally:
            llm.shutdown()
    assert outs[0] == outs[1] and len(outs[0]) == 36
