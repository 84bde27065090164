"""Test doubles for driving the scheduler without a model.

``FakeRunner`` plays the model runner honestly: it keeps per-request state the way a real
runner must (registering on ``is_new``, dropping on finished/preempted), writes every
computed token into a simulated paged KV cache through the block table, and checks that
every position a step attends to holds the right token. A scheduler or block-manager bug
(stale prefix hit, block reused while still in use, wrong positions) fails loudly here.

Like the real runner it keeps each request's block table from the deltas the scheduler
sends (``ScheduledRequest.new_block_ids``: the whole table when ``is_new``, then the ids
appended since), in a :class:`BlockTableMirror`; ``step`` asserts after every step that
the mirror equals every running request's ``block_ids``, so every test driven through
``step`` / ``run_all`` also checks the deltas.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from forkless.core.request import FinishReason, Request
from forkless.sampling_params import SamplingParams
from forkless.core.sched import (
    KVCacheConfig,
    ModelRunnerOutput,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)

EOS = 2
VOCAB = 1000


def Params(max_tokens: int | None = 8, **fields: Any) -> SamplingParams:  # noqa: N802 - reads as a type
    """Sampling parameters as the scheduler tests use them (``max_tokens`` 8 by default)."""
    return SamplingParams(max_tokens=max_tokens, **fields)


def default_token(request_id: str, index: int) -> int:
    """A deterministic token for output position ``index``; never EOS."""
    return 10 + zlib.crc32(f"{request_id}:{index}".encode()) % VOCAB


TokenFn = Callable[[str, int], int]


class BlockTableMirror:
    """The runner's view of the block tables, rebuilt from the scheduler's deltas."""

    def __init__(self) -> None:
        self.tables: dict[str, list[int]] = {}

    def apply(self, out: SchedulerOutput) -> None:
        """Take one step's plan: drop finished/preempted tables, then apply the deltas."""
        for rid in out.finished_request_ids + out.preempted_request_ids:
            self.tables.pop(rid, None)
        for item in out.scheduled_requests:
            if item.is_new:
                # A (re)admission carries the whole table and replaces any old one.
                self.tables[item.request_id] = list(item.new_block_ids)
            else:
                assert item.request_id in self.tables, f"{item.request_id} scheduled but never registered"
                self.tables[item.request_id].extend(item.new_block_ids)

    def check(self, scheduler: Scheduler) -> None:
        """Every running request's table here equals the scheduler's ``block_ids``."""
        for request in scheduler.running:
            assert self.tables.get(request.request_id) == request.block_ids, (
                f"{request.request_id}: runner table {self.tables.get(request.request_id)} "
                f"!= scheduler block_ids {request.block_ids}"
            )


class FakeRunner:
    """A model runner that samples deterministic tokens and checks the KV protocol.

    Args:
        num_blocks: Blocks of the simulated KV cache.
        block_size: Tokens per block.
        token_fn: ``(request_id, output_index) -> token``; deterministic, so a request
            produces the same tokens whether or not it was preempted.
    """

    def __init__(self, num_blocks: int, block_size: int, token_fn: TokenFn = default_token) -> None:
        self.block_size = block_size
        self.token_fn = token_fn
        self.slots: list[tuple[int, int] | None] = [None] * (num_blocks * block_size)
        self.tokens: dict[str, list[int]] = {}
        self.num_prompt: dict[str, int] = {}
        self.computed: dict[str, int] = {}
        self.registrations: list[str] = []
        self.block_tables = BlockTableMirror()

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for rid in out.finished_request_ids + out.preempted_request_ids:
            self.tokens.pop(rid, None)
            self.computed.pop(rid, None)
        self.block_tables.apply(out)
        sampled: dict[str, list[int]] = {}
        bs = self.block_size
        for item in out.scheduled_requests:
            rid = item.request_id
            if item.is_new:
                assert rid not in self.tokens, f"{rid} re-registered without being dropped"
                assert item.prompt_token_ids is not None and item.output_token_ids is not None
                self.tokens[rid] = list(item.prompt_token_ids) + list(item.output_token_ids)
                self.num_prompt[rid] = len(item.prompt_token_ids)
                self.registrations.append(rid)
            else:
                assert rid in self.tokens, f"{rid} scheduled but never registered"
                assert item.prompt_token_ids is None and item.sampling_params is None
                assert item.start_position == self.computed[rid], "positions skipped or repeated"
            tokens = self.tokens[rid]
            table = self.block_tables.tables[rid]
            start, end = item.start_position, item.start_position + item.num_tokens
            assert item.num_tokens > 0
            assert item.token_ids == tokens[start:end]
            assert len(table) * bs >= end, "block table too short"
            assert len(table) == -(-end // bs), "block table longer than needed"
            for pos in range(start, end):
                self.slots[table[pos // bs] * bs + pos % bs] = (tokens[pos], pos)
            # Attention reads every earlier position through the block table.
            for pos in range(end):
                got = self.slots[table[pos // bs] * bs + pos % bs]
                assert got == (tokens[pos], pos), f"{rid}: KV at position {pos} is {got}"
            self.computed[rid] = end
            assert item.sample == (end == len(tokens))
            if item.sample:
                token = self.token_fn(rid, len(tokens) - self.num_prompt[rid])
                tokens.append(token)
                sampled[rid] = [token]
        return ModelRunnerOutput(sampled_token_ids=sampled)


@dataclass
class Result:
    """What the engine saw of one request."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_cached_tokens: int = 0
    stop_reason: int | None = None


def check_step(scheduler: Scheduler, out: SchedulerOutput) -> None:
    """Per-step invariants every schedule() must keep."""
    cfg = scheduler.scheduler_config
    total = sum(item.num_tokens for item in out.scheduled_requests)
    assert out.num_batched_tokens == total
    assert total <= cfg.max_num_batched_tokens
    assert len(scheduler.running) <= cfg.max_num_seqs
    ids = [item.request_id for item in out.scheduled_requests]
    assert len(ids) == len(set(ids))
    assert not set(ids) & set(out.preempted_request_ids)
    num_prefills = num_long = 0
    for item in out.scheduled_requests:
        request = scheduler.requests[item.request_id]
        assert request in scheduler.running
        assert item.start_position + item.num_tokens <= scheduler.max_model_len
        # Partial-prefill limits (chunked prefill only): a prefill had more than one token
        # left to compute, a long one more than the threshold (and a prompt over
        # long_prefill_min_prompt_tokens), whose chunks it caps.
        left = request.num_tokens - item.start_position
        if cfg.enable_chunked_prefill and left > 1:
            num_prefills += 1
            exempt = max(left, request.num_prompt_tokens) <= cfg.long_prefill_min_prompt_tokens
            if 0 < cfg.long_prefill_token_threshold < left and not exempt:
                num_long += 1
                assert item.num_tokens <= cfg.long_prefill_token_threshold
    if cfg.enable_chunked_prefill:
        if cfg.max_num_partial_prefills is not None:
            assert num_prefills <= cfg.max_num_partial_prefills
        assert num_long <= cfg.max_long_partial_prefills
    if cfg.max_running_seqs_per_request:
        per_group = Counter(request.group_id for request in scheduler.running)
        assert max(per_group.values(), default=0) <= cfg.max_running_seqs_per_request, per_group
        assert scheduler._group_running == dict(per_group)
    scheduler.kv_cache_manager.check_invariants()


def step(scheduler: Scheduler, runner: FakeRunner, results: dict[str, Result]) -> SchedulerOutput:
    """One engine-core iteration; returns the plan it ran."""
    out = scheduler.schedule()
    check_step(scheduler, out)
    runner_out = runner.execute(out)
    runner.block_tables.check(scheduler)
    for eco in scheduler.update_from_output(out, runner_out):
        result = results.setdefault(eco.request_id, Result())
        result.token_ids.extend(eco.new_token_ids)
        result.num_cached_tokens = eco.num_cached_tokens
        if eco.finished:
            result.finish_reason = eco.finish_reason
            result.stop_reason = eco.stop_reason
    scheduler.kv_cache_manager.check_invariants()
    runner.block_tables.check(scheduler)
    for rid, request in scheduler.requests.items():
        if rid in runner.tokens:
            assert runner.tokens[rid] == request.all_token_ids
    return out


def run_all(
    scheduler: Scheduler,
    runner: FakeRunner,
    results: dict[str, Result] | None = None,
    max_steps: int = 10_000,
) -> dict[str, Result]:
    """Step until every request finished, accumulating into ``results``; fails on a stall."""
    results = {} if results is None else results
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return results
        step(scheduler, runner, results)
    raise AssertionError(f"not finished after {max_steps} steps: {scheduler.requests}")


def make_request(
    rid: str,
    prompt: list[int] | int,
    max_tokens: int | None = 8,
    arrival: float = 0.0,
    priority: int = 0,
    group_id: str | None = None,
    **params: object,
) -> Request:
    """A request; an int ``prompt`` makes that many distinct tokens from ``rid``."""
    if isinstance(prompt, int):
        prompt = [default_token(rid, -1 - i) for i in range(prompt)]
    return Request(
        rid, prompt, Params(max_tokens=max_tokens, **params),  # type: ignore[arg-type]
        eos_token_id=EOS, arrival_time=arrival, priority=priority, group_id=group_id,
    )


def assert_no_leaks(scheduler: Scheduler) -> None:
    """Nothing referenced once every request is gone."""
    kv = scheduler.kv_cache_manager
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_blocks
    assert kv.usage == 0.0
    assert not scheduler.running and not len(scheduler.waiting) and not scheduler.requests
    assert not scheduler._group_running


class CustomScheduler(Scheduler):
    """A third-party scheduler, importable as ``core_fakes:CustomScheduler``."""


class NotAScheduler:
    """Importable, but not a SchedulerInterface."""


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_model_len: int = 64,
    prefix_caching: bool = True,
    token_fn: TokenFn = default_token,
    **scheduler_kw: object,
) -> tuple[Scheduler, FakeRunner]:
    """A scheduler over a small KV cache, and a fake runner with a matching cache."""
    scheduler = Scheduler(
        SchedulerConfig(max_model_len=max_model_len, **scheduler_kw),  # type: ignore[arg-type]
        KVCacheConfig(num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=prefix_caching),
    )
    return scheduler, FakeRunner(num_blocks, block_size, token_fn)
