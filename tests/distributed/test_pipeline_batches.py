"""Pipeline parallelism's micro-batches (``-pp 2``, two gloo worker processes): the engine
core keeps one batch in flight per stage, and the tokens are those of one batch at a time
(a scheduler that declares no concurrent batches, ``--scheduler-cls``), which
``test_tensor_parallel.py`` checks against one worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkless import LLM, SamplingParams
from forkless.core.sched.scheduler import Scheduler
from tests.distributed.conftest import PROMPTS


class OneBatchScheduler(Scheduler):
    """The built-in scheduler, declaring that it cannot plan concurrent batches."""

    supports_concurrent_batches = False


def _run(model: Path, scheduler_cls: str | None) -> tuple[list, int, int]:
    """Greedy outputs of 8 prompts through ``-pp 2``; the most batches in flight at once,
    and how many batches ran."""
    llm = LLM(model=str(model), pipeline_parallel_size=2, max_model_len=128, kv_cache_memory=16 << 20,
              scheduler_cls=scheduler_cls)
    executor = llm.llm_engine.engine_core.executor
    launch, collect, step = executor.execute_model_async, executor.collect, executor.execute_model
    count = {"now": 0, "peak": 0, "batches": 0}

    def counted(run):
        def wrapper(plan):
            count["now"] += 1
            count["batches"] += 1
            count["peak"] = max(count["peak"], count["now"])
            return run(plan)
        return wrapper

    def counted_collect(handle):
        count["now"] -= 1
        return collect(handle)

    def counted_step(plan):  # one batch at a time: launched and collected in one call
        out = counted(step)(plan)
        count["now"] -= 1
        return out

    executor.execute_model_async, executor.collect = counted(launch), counted_collect
    executor.execute_model = counted_step
    try:
        params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
        outs = llm.generate(PROMPTS * 2, params, use_tqdm=False)
        return [o.outputs[0] for o in outs], count["peak"], count["batches"]
    finally:
        llm.shutdown()


@pytest.mark.slow
def test_two_stages_keep_two_micro_batches_in_flight(tp_models: dict[str, Path]) -> None:
    pipelined, peak, batches = _run(tp_models["llama"], None)
    one_at_a_time, peak_one, batches_one = _run(tp_models["llama"], f"{__name__}:OneBatchScheduler")
    assert peak == 2 and peak_one == 1
    # Each micro-batch holds half of the requests: about twice the batches.
    assert batches >= 2 * batches_one - 2
    assert [o.token_ids for o in pipelined] == [o.token_ids for o in one_at_a_time]
    for a, b in zip(pipelined, one_at_a_time):
        for lp_a, lp_b in zip(a.logprobs, b.logprobs):
            assert lp_a.keys() == lp_b.keys()
            for tok in lp_a:
                assert lp_a[tok].logprob == pytest.approx(lp_b[tok].logprob, abs=1e-5)


@pytest.mark.slow
def test_ngram_drafts_through_two_stages_keep_the_greedy_tokens(tp_models: dict[str, Path]) -> None:
    # The last stage verifies and drafts; the first runs the drafted rows' positions too.
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    outs = {}
    for name, extra in (("plain", {}), ("ngram", {"speculative_config": spec})):
        llm = LLM(model=str(tp_models["llama"]), pipeline_parallel_size=2, max_model_len=128,
                  kv_cache_memory=16 << 20, **extra)
        try:
            outs[name] = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS * 2, params, use_tqdm=False)]
            if name == "ngram":
                assert llm.llm_engine.engine_core.make_stats().spec_decode.num_draft_tokens > 0
        finally:
            llm.shutdown()
    assert outs["ngram"] == outs["plain"]


@pytest.mark.slow
def test_constrained_requests_through_two_stages_follow_their_grammar(tp_models: dict[str, Path]) -> None:
    # A micro-batch's bitmask is filled when it is planned: its requests' grammars have
    # taken every token before it (none of them is in flight).
    from forkless import StructuredOutputsParams

    choices = ["alpha beta", "gamma", "delta epsilon zeta"]
    params = [SamplingParams(max_tokens=12, temperature=0, structured_outputs=StructuredOutputsParams(choice=choices))
              for _ in range(4)] + [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)] * 4
    llm = LLM(model=str(tp_models["llama"]), pipeline_parallel_size=2, max_model_len=128, kv_cache_memory=16 << 20)
    try:
        outs = llm.generate(PROMPTS * 2, params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert all(o.outputs[0].text in choices for o in outs[:4])
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs[4:])
