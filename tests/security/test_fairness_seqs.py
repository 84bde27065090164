"""One request for many sequences does not take every slot (engine, CPU server defaults).

``forkless serve`` on CPU runs at most ``CPU_DEFAULT_MAX_RUNNING_SEQS_PER_REQUEST``
sequences of one request at once (``--max-running-seqs-per-request``): the ``n`` children
of a request and, through the API server's ``group_id``, the prompts of one completions
request count together. Before, a request at ``--max-sequences-per-request`` (32 prompts
x ``n`` 8) filled all 256 slots of ``--max-num-seqs``; every other request waited for it
all and then ran in steps of ~257 sequences (48x its p99 on a 2-core CPU,
benchmarks/README.md, "Hostile clients"). The offline ``LLM`` keeps vLLM's behaviour.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from forkless import SamplingParams
from forkless.config import CPU_DEFAULT_MAX_RUNNING_SEQS_PER_REQUEST, AsyncEngineArgs, EngineArgs
from forkless.engine.llm_engine import LLMEngine

CAP = CPU_DEFAULT_MAX_RUNNING_SEQS_PER_REQUEST


def test_the_server_limits_sequences_per_request_on_cpu_and_the_offline_engine_does_not(tiny_llama: Path) -> None:
    server = AsyncEngineArgs(model=str(tiny_llama)).create_engine_config().scheduler_config
    assert server.max_running_seqs_per_request == CAP > 0
    offline = EngineArgs(model=str(tiny_llama)).create_engine_config().scheduler_config
    assert offline.max_running_seqs_per_request == 0
    explicit = AsyncEngineArgs(model=str(tiny_llama), max_running_seqs_per_request=0).create_engine_config()
    assert explicit.scheduler_config.max_running_seqs_per_request == 0


@pytest.mark.parametrize("value", [-1, 2.5, "8"])
def test_a_bad_flag_is_refused_naming_it(tiny_llama: Path, value: object) -> None:
    with pytest.raises(ValueError, match=r"--max-running-seqs-per-request=.* expected an integer >= 0"):
        EngineArgs(model=str(tiny_llama), max_running_seqs_per_request=value).create_engine_config()


def test_a_request_for_many_sequences_shares_the_steps(tiny_llama: Path) -> None:
    engine = LLMEngine.from_engine_args(AsyncEngineArgs(model=str(tiny_llama), kv_cache_memory=64 << 20))
    try:
        scheduler = engine.engine_core.scheduler
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        # n children share their parent's group; the prompts of one API request share the
        # group_id the API server gives them.
        engine.add_request("big", {"prompt_token_ids": [11, 12, 13]}, SamplingParams(
            top_k=1, max_tokens=4, ignore_eos=True, n=3 * CAP))
        for i in range(2):
            processed = engine.processor.process_inputs(f"api-{i}", {"prompt_token_ids": [21 + i, 22]},
                                                        params.clone(), group_id="api")
            engine.output_processor.add_request(processed)
            for core_request in processed.core_requests:
                assert core_request.group_id == "api"
                engine.engine_core.add_request(core_request)
        engine.step()
        engine.add_request("small", {"prompt_token_ids": [31, 32]}, params)
        engine.step()
        running = Counter(r.group_id for r in scheduler.running)
        assert running["big"] == CAP and running["api"] == 2 and running["small"] == 1, running
        finished = set()
        while engine.has_unfinished_requests():
            for out in engine.step():
                assert len(out.outputs) == (3 * CAP if out.request_id == "big" else 1)
                if out.finished:
                    finished.add(out.request_id)
                    assert all(len(c.token_ids) == 4 for c in out.outputs)
            assert max(Counter(r.group_id for r in scheduler.running).values(), default=0) <= CAP
        assert finished == {"big", "api-0", "api-1", "small"}
    finally:
        engine.shutdown()
