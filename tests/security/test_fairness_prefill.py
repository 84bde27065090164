"""A short request is not stuck behind a long prompt's prefill (engine, default flags, CPU).

Before the fix, the long prompt's chunked prefill took the whole 2,048-token budget of
every step, and a 2-token request sent 3 s after one 8,191-token prompt waited 90 s on a
2-core CPU: it was admitted only once the long prefill was done. With forkless's CPU
defaults (``--long-prefill-token-threshold 64``, one long prefill at a time) the long
prompt takes 64 tokens a step and the short request is admitted in the next step.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from forkless import SamplingParams
from forkless.config import CPU_DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD, AsyncEngineArgs
from forkless.engine.llm_engine import LLMEngine
from tests.conftest import make_tiny_model

LONG = 8000


@pytest.fixture(scope="module")
def long_context_model(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama of ``tiny_llama``, with an 8k context."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-8k"), smollm2_folder, max_position_embeddings=8192)


def test_short_request_finishes_before_the_long_prefill(long_context_model: Path) -> None:
    engine = LLMEngine.from_engine_args(AsyncEngineArgs(model=str(long_context_model), kv_cache_memory=64 << 20))
    try:
        sched = engine.engine_core.scheduler.scheduler_config
        assert sched.long_prefill_token_threshold == CPU_DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD
        assert sched.max_num_batched_tokens >= 2048 and sched.max_num_partial_prefills is None
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        engine.add_request("long", {"prompt_token_ids": [100 + i % 5000 for i in range(LONG)]}, params)
        engine.step()  # the long prefill's first chunk
        engine.add_request("short", {"prompt_token_ids": [11, 12]}, params)
        first_token_at: dict[str, int] = {}
        finished_at: dict[str, float] = {}
        steps = 1
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            outputs = engine.step()
            steps += 1
            for out in outputs:
                if out.outputs[0].token_ids:
                    first_token_at.setdefault(out.request_id, steps)
                if out.finished:
                    finished_at[out.request_id] = time.perf_counter() - start
        long_prefill_steps = -(-LONG // CPU_DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD)
        # Admitted in step 2, next to the long prefill's second chunk: first token at once.
        assert first_token_at["short"] == 2
        # Four tokens later it is done; the long prompt's prefill still has most of its
        # chunks to go, and its first token comes only when all of them are done. (While
        # the short one runs, the time share may hold the long prompt back a few steps.)
        assert long_prefill_steps <= first_token_at["long"] <= long_prefill_steps + 4
        assert finished_at["short"] < finished_at["long"] / 4
    finally:
        engine.shutdown()
