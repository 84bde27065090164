"""Randomized workloads: random configs, lengths, shared prefixes, stops and aborts.

``step`` (core_fakes) checks the per-step invariants: token budget, ``max_num_seqs``,
block bookkeeping, runner/scheduler agreement, and, through the fake runner's simulated
paged KV cache, that every attended position holds the right token.
"""

from __future__ import annotations

import random
import zlib

import pytest

from core_fakes import EOS, Result, assert_no_leaks, default_token, make_request, make_scheduler, step
from forkless.core.request import FinishReason


def noisy_token(rid: str, index: int) -> int:
    """Deterministic, with an EOS about one time in 12."""
    if zlib.crc32(f"eos:{rid}:{index}".encode()) % 12 == 0:
        return EOS
    return default_token(rid, index)


@pytest.mark.parametrize("seed", range(40))
def test_random_workload_keeps_invariants(seed: int) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 8])
    max_model_len = rng.randint(16, 96)
    chunked = rng.random() < 0.8
    budget = rng.randint(1, 48) if chunked else max_model_len + rng.randint(0, 16)
    num_blocks = -(-max_model_len // block_size) * rng.choice([1, 1, 1, 2, 3])
    # Partial-prefill limits (None: no limit); check_step asserts them every step.
    max_partial = rng.choice([None, None, rng.randint(1, 4)]) if chunked else None
    max_long = rng.randint(1, max_partial or 3)
    s, runner = make_scheduler(
        num_blocks=num_blocks,
        block_size=block_size,
        max_model_len=max_model_len,
        prefix_caching=rng.random() < 0.7,
        token_fn=noisy_token,
        max_num_seqs=rng.randint(1, 8),
        max_num_batched_tokens=budget,
        policy=rng.choice(["fcfs", "priority"]),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=rng.choice([0, 0, rng.randint(1, 16)]),
        long_prefill_min_prompt_tokens=rng.choice([0, 0, rng.randint(1, 24)]),
        max_num_partial_prefills=max_partial,
        max_long_partial_prefills=max_long,
    )
    prefixes = [[rng.randrange(10, 50) for _ in range(rng.randint(1, 24))] for _ in range(3)]
    requests = {}
    aborted: set[str] = set()
    results: dict[str, Result] = {}
    next_id = 0
    for step_no in range(3000):
        if next_id < 40 and rng.random() < 0.3:
            rid = f"r{next_id}"
            next_id += 1
            prompt = rng.choice(prefixes)[: rng.randint(0, 24)] + [
                rng.randrange(10, 50) for _ in range(rng.randint(1, 24))
            ]
            prompt = prompt[: max_model_len - 1]
            stop = [default_token(rid, rng.randrange(20))] if rng.random() < 0.2 else None
            max_tokens = rng.choice([None, rng.randint(1, 40)])
            min_tokens = rng.choice([0, 0, 3])
            request = make_request(
                rid,
                prompt,
                max_tokens=max_tokens,
                arrival=float(step_no),
                priority=rng.randint(0, 3),
                min_tokens=min_tokens if max_tokens is None else min(min_tokens, max_tokens),
                ignore_eos=rng.random() < 0.2,
                stop_token_ids=stop,
            )
            requests[rid] = request
            s.add_request(request)
        if s.requests and rng.random() < 0.03:
            rid = rng.choice(sorted(s.requests))
            s.finish_requests(rid, FinishReason.ABORT)
            aborted.add(rid)
            s.kv_cache_manager.check_invariants()
        if next_id >= 40 and not s.has_unfinished_requests():
            break
        step(s, runner, results)
    else:
        pytest.fail(f"stalled: {s.requests}")

    assert_no_leaks(s)
    for rid, request in requests.items():
        result = results.get(rid, Result())
        n = len(result.token_ids)
        assert result.token_ids == [noisy_token(rid, i) for i in range(n)]
        assert request.output_token_ids == result.token_ids
        if rid in aborted:
            assert request.finish_reason is FinishReason.ABORT
            continue
        assert result.finish_reason is request.finish_reason is not None
        assert request.num_prompt_tokens + n <= max_model_len
        if request.max_tokens is not None:
            assert n <= request.max_tokens
        if result.finish_reason is FinishReason.LENGTH:
            assert n == request.max_tokens or request.num_prompt_tokens + n == max_model_len
        else:
            last = result.token_ids[-1]
            assert n >= request.min_tokens
            assert (last == EOS and not request.ignore_eos) or last in request.stop_token_ids
