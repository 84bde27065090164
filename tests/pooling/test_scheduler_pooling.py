"""Pooling requests in the default scheduler: whole prompts, batched with generation, done
after their prefill, never a decode step."""

from __future__ import annotations

import numpy as np

from forkless.core.request import Request
from forkless.core.sched import KVCacheConfig, Scheduler
from forkless.core.sched.config import SchedulerConfig
from forkless.pooling_params import PooledData, PoolingParams
from forkless.protocol.step import ModelRunnerOutput
from forkless.sampling_params import SamplingParams


def _request(rid: str, n: int, pooling: bool) -> Request:
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=3, ignore_eos=True),
                   pooling_params=PoolingParams() if pooling else None)


def _run_step(s: Scheduler):
    out = s.schedule()
    pooled, sampled = {}, {}
    for item in out.scheduled_requests:
        if item.sample:
            if item.pooling_params is not None:
                pooled[item.request_id] = PooledData.from_numpy(np.full(4, len(item.token_ids), np.float32))
            else:
                sampled[item.request_id] = [7]
    return out, s.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled, pooler_output=pooled))


def test_pooling_requests_run_whole_and_finish_after_their_prefill() -> None:
    s = Scheduler(SchedulerConfig(max_model_len=32, max_num_batched_tokens=40, enable_chunked_prefill=True),
                  KVCacheConfig(num_blocks=64, block_size=4, enable_prefix_caching=True))
    s.add_request(_request("gen", 6, pooling=False))
    for i in range(4):
        s.add_request(_request(f"p{i}", 12, pooling=True))
    s.add_request(_request("full", 32, pooling=True))  # a pooled prompt may fill max_model_len
    finished: dict[str, list[int]] = {}
    steps = []
    while s.has_unfinished_requests():
        out, outputs = _run_step(s)
        steps.append([(i.request_id, len(i.token_ids)) for i in out.scheduled_requests])
        for o in outputs:
            if o.finish_reason is not None:
                finished[o.request_id] = o.pooling_output.to_numpy().tolist() if o.pooling_output else o.new_token_ids
    # Step 1: the generation prompt and as many whole pooled prompts as the budget holds.
    assert steps[0] == [("gen", 6), ("p0", 12), ("p1", 12)]
    # The rest wait for room rather than run in chunks, and each runs exactly once.
    for i in range(4):
        assert [n for step in steps for rid, n in step if rid == f"p{i}"] == [12]
    assert [n for step in steps for rid, n in step if rid == "full"] == [32]
    assert finished["p3"] == [12.0] * 4 and finished["full"] == [32.0] * 4
    # The generation request decodes alongside; pooled ones never get a decode step.
    assert [n for step in steps for rid, n in step if rid == "gen"] == [6, 1, 1]
    assert s.kv_cache_manager.usage == 0.0
