"""The default continuous-batching scheduler.

Each step spends a token budget: running requests first (one token per decode, the next
chunk of a partially computed prompt), then waiting requests are admitted in policy order
while the budget, ``max_num_seqs`` and the KV cache allow. Prefill and decode share
steps; a prompt longer than the remaining budget is chunked across steps.

Nobody stalls everyone else with a long prompt (with chunked prefill on). A prefill is a
request with more than one token left to compute; it is *long* when more than
``long_prefill_token_threshold`` (> 0) are left, unless its prompt has at most
``long_prefill_min_prompt_tokens`` tokens (> 0; forkless only): such a prompt is ordinary
work, scheduled whole, so that a small chunk cap for long prompts does not chunk (and
queue behind one another) the ordinary ones. Then, in every step:

* a long prefill's chunk is at most ``long_prefill_token_threshold`` tokens, so while the
  long prefills take at most ``max_long_partial_prefills * long_prefill_token_threshold``
  tokens, the rest of the budget goes to decodes and to requests that just arrived: a
  short request is admitted in the next step, not after the long prompt;
* at most ``max_num_partial_prefills`` requests prefill (``None``: no limit), and at most
  ``max_long_partial_prefills`` of them are long. A waiting long prompt over that limit is
  passed over for this step, and the shorter requests queued behind it are admitted;
  it keeps its place in the queue, so long prompts are still served in policy order.

With ``long_prefill_time_share`` (> 0) a token cap becomes a time cap: while other
requests run, long prefills take at most that share of the measured step time, in chunks
sized to it (``time_share.py``); a long prompt alone is not limited. A prompt of more than
``long_prefill_token_threshold`` tokens is then long until its prefill ends: its last
tokens attend over all the others, so they are its dearest, not short work.

One request for many sequences (``n`` children, many prompts: one ``Request.group_id``)
does not take every slot either: with ``max_running_seqs_per_request`` (> 0) at most that
many of a group's sequences run at once. A waiting sequence of a group at the limit is
passed over, like a long prompt over its limit, and keeps its place; the requests queued
behind it are admitted. As the group's running sequences finish, its next ones are
admitted, so the group and the others take turns instead of the others waiting for it all.

Nor does one client with many connections (``Request.client_key``: the API server's
``user`` field or peer address; ``None`` for the offline engine, whose requests are all one
client). With ``max_prefill_tokens_per_client`` = R (> 0), while requests of more than one
client are running or waiting, each client with requests earns R prompt tokens of credit a
step and holds at most 2R (it starts full); its prefills (chunks of its running prompts,
the prompts it gets admitted) spend it. A running prompt's chunk is cut to the credit; a
waiting prompt starts once the credit covers it (or is full, for a prompt over 2R) and is
otherwise passed over like a long prompt over its limit, keeping its place, so that other
clients' requests queued behind it are admitted in this step. One client's prompts then
take at most 2R tokens of a step and R a step on average; every client earns credit every
step, so none starves. A client alone is not limited, nor are decodes (one token a
request, bounded by ``max_num_seqs`` and ``max_running_seqs_per_request``), and when
credit holds back every prompt and nothing else can run, the step runs them anyway
(``schedule``), so the share never idles the engine.

Why credit per step rather than round-robin admission: what one client's requests feel
from another's is the step time, and on a CPU that grows with each prompt in the step
(2 cores, default model: ~2 ms a prompt token and ~15 ms a new request; a decode step of 7
requests takes ~75 ms). 32 connections that each sent a 16-token prompt and dropped after
its first token put ~30 prompts in one step (~3 s) while another client's request decoded
one token a step (11.6x its p99); round-robin would still admit all 30 in that step,
since the budget (2,048 tokens) holds them. A cap per step (one 16-token prompt a step)
measured ~2.1x: the prompt and the new request in every step cost as much as the others'
decodes. Credit of R a step with bursts of 2R lets a short prompt go whole in one step
(chunks would pay the per-step cost twice) every other step: ~1.5x
(benchmarks/README.md, "Hostile clients").

A step sends the runner each running request's block ids appended since it was last
scheduled, not its whole table (``ScheduledRequest.new_block_ids``): ``num_block_ids_sent``
counts what the runner holds. That is sound because a running request's ``block_ids`` only
grows (the KV-cache manager appends; cache hits come only at admission) until it is freed
whole; a (re)admitted request sends its whole table and starts counting again.

When a running request needs a block and none is free, the lowest-ranked running request
is preempted by recomputation: its blocks are freed (full ones stay in the prefix cache)
and it goes back to the waiting queue, to recompute prompt + output on readmission.

With a KV connector (``set_kv_connector``), admission asks it after the local prefix
cache how many more of the prompt's tokens it can load. A synchronous connector's tokens
count as computed in the admitting step (the worker loads them before the forward pass);
an asynchronous connector's request holds its blocks in ``WAITING_FOR_REMOTE_KVS``, outside
``running`` and the budget, until a worker reports the load done, and then returns to the
head of the waiting queue. Blocks a connector still uses when their request finishes (an
asynchronous save reads them, a load writes them) are freed only once every such transfer
is reported done, and until then ``has_unfinished_requests`` stays true so that the engine
keeps stepping. Blocks that failed to load set their holder back to the first failed one.

Requests that could never be served are refused up front so the loop cannot deadlock:
``add_request`` raises ``ValueError`` for an empty prompt or one of ``max_model_len``
tokens or more (no room for a generated token), and the constructor raises when the KV
cache cannot hold one ``max_model_len`` sequence. A request alone therefore always fits,
so preempting everything ranked below a request always makes room for it. Generation
that would exceed ``max_model_len`` is cut there with finish reason ``"length"``.

Several batches in flight (pipeline parallelism's micro-batches, ``set_max_concurrent_batches``
with n > 1): the engine core plans a batch while up to n - 1 earlier ones still run, so a
request whose sampled token is not back yet (``num_output_placeholders``) is left out of the
plan: every token a planned request feeds is known, and each stage runs the batches in
order, so a prefill chunk may follow its request's earlier chunk still in flight. A batch
takes at most ceil(requests / n) requests, so that the requests split into n groups that
take turns instead of one batch holding them all while the other stages idle.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING, Any, Iterable

from forkless.core.kv_cache_manager import KVCacheManager
from forkless.core.request import RequestStatus
from forkless.core.sched.interface import SchedulerInterface
from forkless.core.sched.request_queue import create_request_queue
from forkless.core.sched.time_share import LongPrefillTimeShare
from forkless.logger import init_logger
from forkless.protocol.kv_transfer import BlockIds, KVConnectorOutput, KVTransferStats, encode_connector_metadata
from forkless.protocol.step import (
    PLACEHOLDER_TOKEN_ID,
    EngineCoreOutput,
    FinishReason,
    ScheduledRequest,
    SchedulerOutput,
    SchedulerStats,
)

if TYPE_CHECKING:
    from forkless.core.request import Request
    from forkless.core.sched.config import KVCacheConfig, SchedulerConfig
    from forkless.protocol.step import ModelRunnerOutput
    from forkless.sampling_params import SamplingParams

logger = init_logger(__name__)


def _is_long(left: int, prompt_tokens: int, threshold: int, min_prompt: int, whole_prompt: bool) -> bool:
    """Whether a prefill with ``left`` tokens to compute is long (see the module doc): more
    than ``threshold`` left (with ``whole_prompt``, the time share's rule: in its prompt,
    until its prefill ends), and more than ``min_prompt`` in all."""
    size = max(left, prompt_tokens)
    return 0 < threshold < (size if whole_prompt else left) and size > min_prompt


class Scheduler(SchedulerInterface):
    """Continuous batching with chunked prefill, prefix caching and preemption.

    Args:
        scheduler_config: Batching limits and policy.
        kv_cache_config: The KV cache to manage.

    Raises:
        ValueError: The KV cache is smaller than one ``max_model_len`` sequence.
    """

    def __init__(self, scheduler_config: SchedulerConfig, kv_cache_config: KVCacheConfig) -> None:
        capacity = kv_cache_config.num_blocks * kv_cache_config.block_size
        if capacity < scheduler_config.max_model_len:
            raise ValueError(
                f"the KV cache holds {capacity} tokens ({kv_cache_config.num_blocks} blocks of "
                f"{kv_cache_config.block_size}), fewer than max_model_len "
                f"({scheduler_config.max_model_len}); lower max_model_len or give the cache "
                "more memory"
            )
        self.scheduler_config = scheduler_config
        self.kv_cache_config = kv_cache_config
        self.max_model_len = scheduler_config.max_model_len
        self.kv_cache_manager = KVCacheManager(kv_cache_config)
        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(scheduler_config.policy)
        self.running: list[Request] = []
        self.num_preemptions = 0
        # Reported to the runner by the next schedule() so it can drop their state.
        self._finished_ids: list[str] = []
        # Requests preempted between plans (reset_prefix_cache(reset_running_requests=True)):
        # the next plan reports them, so that the runner drops their state.
        self._preempted_ids: list[str] = []
        # Breaks ties between equal arrival times by insertion order.
        self._arrival_seq: dict[str, int] = {}
        self._seq = itertools.count()
        # Requests whose sampling reads their own output history, which lags by one
        # step under async scheduling: while any is present, steps run synchronously.
        self._history_dependent: set[str] = set()
        # Requests holding drafts to verify: they too keep steps synchronous (a draft
        # row's positions depend on how many of the step before's drafts were kept).
        self._drafted: set[str] = set()
        # Whether the engine core fills structured outputs' bitmasks after planning
        # (set_grammar_deferred): their requests then do not keep steps synchronous.
        self._grammar_deferred = False
        # Batches the engine core keeps in flight (set_max_concurrent_batches).
        self._max_batches = 1
        # Running sequences per group_id, kept only with max_running_seqs_per_request.
        self._max_per_group = scheduler_config.max_running_seqs_per_request
        self._group_running: dict[str, int] = {}
        # Requests (running or waiting) per client_key, kept only with
        # max_prefill_tokens_per_client: the cap applies while it has two keys or more.
        self._max_per_client = scheduler_config.max_prefill_tokens_per_client
        self._client_requests: dict[str | None, int] = {}
        # Prompt tokens each client may compute in the step being scheduled (see
        # _refill_client_credit); empty while fewer than two clients have requests.
        self._client_credit: dict[str | None, int] = {}
        self._time_share: LongPrefillTimeShare | None = None
        cfg = scheduler_config
        if cfg.long_prefill_time_share and cfg.enable_chunked_prefill and cfg.long_prefill_token_threshold:
            self._time_share = LongPrefillTimeShare(cfg.long_prefill_time_share, cfg.long_prefill_token_threshold)
        # The KV connector's scheduler side (--kv-transfer-config; set_kv_connector).
        self.connector: Any = None  # a forkless.kv_transfer.KVConnectorBase
        # Requests admitted with blocks that the connector is loading into between steps:
        # id -> (request, tokens computed once the load ends).
        self._remote_loads: dict[str, tuple[Request, int]] = {}
        # Finished requests whose blocks the connector still uses -- an asynchronous save
        # reads them ("send"), a load writes them ("recv") -- and which of the two: freed
        # once the workers report every one done.
        self._kv_busy: dict[str, tuple[Request, set[str]]] = {}
        self._kv_stats = KVTransferStats()
        # kv_load_failure_policy "fail": a request whose loaded blocks failed ends, and its
        # (id, reason) waits here for the engine core (take_failed_requests).
        self._fail_kv_loads = False
        self._failed: list[tuple[str, str]] = []

    # ----------------------------------------------------------------- requests in / out

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        if request.num_prompt_tokens == 0:
            raise ValueError(f"request {request.request_id!r} has an empty prompt")
        # A pooling request generates nothing: its prompt may fill max_model_len.
        if request.num_prompt_tokens >= self.max_model_len + (request.pooling_params is not None):
            raise ValueError(
                f"request {request.request_id!r}: the prompt has {request.num_prompt_tokens} "
                f"tokens, leaving no room to generate within max_model_len ({self.max_model_len})"
            )
        if request.status is not RequestStatus.WAITING:
            raise ValueError(f"request {request.request_id!r} is {request.status.name}, not WAITING")
        self.requests[request.request_id] = request
        if self.connector is not None:
            self.connector.on_new_request(request)
        self._arrival_seq[request.request_id] = next(self._seq)
        if self._max_per_client:
            self._client_requests[request.client_key] = self._client_requests.get(request.client_key, 0) + 1
        if _reads_output_history(request.sampling_params, self._grammar_deferred):
            self._history_dependent.add(request.request_id)
        self.waiting.add(request)

    def finish_requests(
        self, request_ids: str | Iterable[str], finish_reason: FinishReason = FinishReason.ABORT
    ) -> None:
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        status = RequestStatus.from_finish_reason(finish_reason)
        done_running = False
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None:
                continue
            if request.status is RequestStatus.RUNNING:
                done_running = True
            elif request.status is RequestStatus.WAITING_FOR_REMOTE_KVS:
                del self._remote_loads[rid]
            else:
                self.waiting.remove(request)
            self._finish(request, status)
        if done_running:
            self.running = [r for r in self.running if not r.is_finished]

    def has_unfinished_requests(self) -> bool:
        # Blocks a connector still uses need steps too: the workers report them done.
        return bool(self.requests) or bool(self._kv_busy)

    supports_async_scheduling = True
    supports_kv_connector = True
    supports_concurrent_batches = True

    def set_max_concurrent_batches(self, num_batches: int) -> None:
        self._max_batches = num_batches

    def set_kv_connector(self, connector: Any) -> None:
        self.connector = connector
        self._fail_kv_loads = connector._kv_transfer_config.kv_load_failure_policy == "fail"

    def take_failed_requests(self) -> list[tuple[str, str]]:
        failed, self._failed = self._failed, []
        return failed

    def set_grammar_deferred(self, deferred: bool) -> None:
        self._grammar_deferred = deferred

    def can_schedule_async(self) -> bool:
        """Whether the next step may be scheduled before the previous one's tokens
        are back (no request's sampling depends on its latest tokens, none holds drafts
        to verify)."""
        return not self._history_dependent and not self._drafted

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ------------------------------------------------------------------------- the step

    def schedule(self) -> SchedulerOutput:
        share_clients = self._refill_client_credit()
        output = self._schedule(self._time_share is not None, share_clients)
        if (self._time_share is not None or share_clients) and not output.scheduled_requests \
                and not output.preempted_request_ids:
            # Time share held a long prefill back, or the client shares held every prompt
            # back, and nothing else could run (blocked on KV blocks or max_num_seqs, or
            # only prompts waiting): an empty step would never earn anyone the credit.
            # (The first pass took the finished ids to report: hand them on.)
            self._finished_ids = output.finished_request_ids + self._finished_ids
            output = self._schedule(False, False)
        if self.connector is not None:
            # Once per step, after the plan is final (a first pass's admissions stay
            # admitted: their loads are in the connector's state already).
            output.kv_connector_metadata = encode_connector_metadata(self.connector.build_connector_meta(output))
        return output

    def _refill_client_credit(self) -> bool:
        """Give each client with requests its prompt tokens for this step; whether the
        client shares apply to it (several clients have requests)."""
        rate = self._max_per_client
        if not rate or len(self._client_requests) < 2:
            self._client_credit.clear()  # when contention starts again, everyone starts full
            return False
        burst = 2 * rate
        credit = self._client_credit
        for key in self._client_requests:
            credit[key] = min(credit.get(key, burst) + rate, burst)
        for key in [k for k in credit if k not in self._client_requests]:
            del credit[key]
        return True

    def _schedule(self, share_time: bool, share_clients: bool = False) -> SchedulerOutput:
        cfg = self.scheduler_config
        kv = self.kv_cache_manager
        budget = cfg.max_num_batched_tokens
        scheduled: dict[str, int] = {}  # insertion order is batch order
        spec_of: dict[str, int] = {}  # draft tokens among a running request's scheduled ones
        admitted: set[str] = set()
        preempted: list[str] = []

        # Partial-prefill limits, hoisted: without chunked prefill no prefill is partial
        # and none of them apply. A prefill is a request with more than one token left to
        # compute (a decode computes exactly one); it is long when more than `threshold`.
        limited = cfg.enable_chunked_prefill
        threshold = cfg.long_prefill_token_threshold if limited else 0
        min_prompt = cfg.long_prefill_min_prompt_tokens
        max_prefills = cfg.max_num_partial_prefills if limited else None
        max_long = cfg.max_long_partial_prefills
        # Ids, not counts: a preempted victim's prefill must stop counting.
        prefill_ids: set[str] = set()
        long_ids: set[str] = set()
        # The token cap of a long chunk this step (0: long prefills sit this step out).
        long_chunk = threshold
        contended = False
        time_share = self._time_share
        if time_share is not None and share_time:
            contended = self._contended(max(threshold, min_prompt))
            long_chunk = time_share.long_chunk(contended)
        largest_long = 0
        # The prompt tokens each client may still compute this step, while the client
        # shares apply; what each request took, to give back a preempted victim's.
        credit = self._client_credit if share_clients else None
        burst = 2 * self._max_per_client
        client_tokens: dict[str, int] = {}

        running_status = RequestStatus.RUNNING
        allocate_slots = kv.allocate_slots
        # Several batches in flight: this one's share of the requests, and none whose
        # token is still in flight in another (see the module doc).
        batch_queue = self._max_batches > 1
        max_reqs = -(-len(self.requests) // self._max_batches) if batch_queue else cfg.max_num_seqs
        for request in list(self.running):
            if budget == 0 or len(scheduled) >= max_reqs:
                break
            if request.status is not running_status:
                continue  # preempted earlier in this loop
            pending = request.num_output_placeholders
            if pending and batch_queue:
                continue
            if pending and (request.pooling_params is not None or self._finishes_with_pending(request)):
                # The token in flight ends it, or its pooled prompt is in flight (a pooling
                # request never decodes): nothing more to compute.
                continue
            num_new = request.num_tokens + pending - request.num_computed_tokens
            is_prefill = is_long = False
            if limited and num_new > 1:
                is_prefill = True
                is_long = _is_long(num_new, request.num_prompt_tokens, threshold, min_prompt, time_share is not None)
                if (max_prefills is not None and len(prefill_ids) >= max_prefills) or (
                    is_long and (len(long_ids) >= max_long or not long_chunk)
                ):
                    continue  # over the limits this step; it keeps its blocks
                if is_long:
                    num_new = min(num_new, long_chunk)
            if credit is not None and is_prefill:
                allowance = credit[request.client_key]
                if allowance < 1:
                    continue  # its client's share of this step is spent; it keeps its blocks
                num_new = min(num_new, allowance)
            num_spec = 0
            if request.spec_token_ids and num_new == 1 and not pending:
                num_spec = self._num_spec_tokens(request, budget)
                num_new += num_spec
            if num_new > budget:
                num_new = budget
            if num_new == 0:
                continue
            while allocate_slots(request, num_new) is None:
                victim = max(self.running, key=self._preemption_key)
                self._preempt(victim)
                preempted.append(victim.request_id)
                budget += scheduled.pop(victim.request_id, 0)
                spec_of.pop(victim.request_id, None)
                if victim.request_id in client_tokens:
                    credit[victim.client_key] += client_tokens.pop(victim.request_id)  # type: ignore[index]
                prefill_ids.discard(victim.request_id)
                long_ids.discard(victim.request_id)
                if victim is request:
                    break
            else:
                scheduled[request.request_id] = num_new
                if num_spec:
                    spec_of[request.request_id] = num_spec
                budget -= num_new
                if is_prefill:
                    prefill_ids.add(request.request_id)
                    if credit is not None:
                        credit[request.client_key] -= num_new
                        client_tokens[request.request_id] = num_new
                    if is_long:
                        long_ids.add(request.request_id)
                        largest_long = max(largest_long, num_new)

        # Admitting while preempting would just thrash: the freed blocks go to running work.
        # Long prompts over max_long_partial_prefills, and sequences of a group at
        # max_running_seqs_per_request, and prompts of a client whose share of the step
        # (max_prefill_tokens_per_client) is spent, are set aside so that the requests
        # behind them are admitted now; they go back to their places afterwards.
        skipped: list[Request] = []
        while (not preempted and self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs
               and len(scheduled) < max_reqs):
            request = self.waiting.peek()
            if self._max_per_group and self._group_running.get(request.group_id, 0) >= self._max_per_group:
                skipped.append(self.waiting.pop())
                continue
            allowance = 0
            if credit is not None:
                allowance = credit[request.client_key]
                # A prompt starts once its client's credit covers it, up to a full burst:
                # a short one then goes whole rather than in chunks over several steps.
                # Without chunked prefill it goes whole anyway, on a full burst.
                if allowance < min(request.num_tokens, burst):
                    skipped.append(self.waiting.pop())
                    continue
            hit_ids, num_hit, num_external = [], 0, 0
            cacheable = not _skips_prefix_cache(request.sampling_params) and request.pooling_params is None
            loaded = bool(request.block_ids)
            if loaded:
                # Back from a KV connector's load: it holds its blocks, filled this far.
                num_hit = request.num_computed_tokens
            elif cacheable:
                hit_ids, num_hit = kv.get_computed_blocks(request)
                if self.connector is not None:
                    num_external, load_async = self._external_tokens(request, num_hit)
                    if num_external is None:  # the connector does not know yet: ask next step
                        skipped.append(self.waiting.pop())
                        continue
                    if load_async:
                        # Its blocks now -- for the whole prompt, so that once loaded it
                        # needs no more to run -- its tokens once the load ends; it takes
                        # no budget.
                        if kv.allocate_slots(request, request.num_tokens - num_hit, hit_ids) is None:
                            break
                        self.waiting.pop()
                        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                        request.num_computed_tokens = num_hit
                        self._remote_loads[request.request_id] = (request, num_hit + num_external)
                        self._connector_admitted(request, num_hit, num_external, True)
                        continue
            remaining = request.num_tokens - num_hit - num_external
            if remaining > budget and not cfg.enable_chunked_prefill:
                break
            is_prefill = limited and remaining > 1
            is_long = is_prefill and _is_long(remaining, request.num_prompt_tokens, threshold, min_prompt,
                                              time_share is not None)
            if is_prefill and max_prefills is not None and len(prefill_ids) >= max_prefills:
                break
            if is_long and (len(long_ids) >= max_long or not long_chunk):
                skipped.append(self.waiting.pop())
                continue
            num_new = min(remaining, long_chunk) if is_long else remaining
            if credit is not None and remaining > 1 and cfg.enable_chunked_prefill:
                num_new = min(num_new, allowance)
            if num_new > budget:
                num_new = budget
            if request.pooling_params is not None and num_new < remaining:
                # A pooled prompt runs whole in one step: an encoder attends both ways and
                # the pooler reads every position; it waits for a step with room.
                break
            if kv.allocate_slots(request, num_external + num_new, hit_ids) is None:
                break
            self.waiting.pop()
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit + num_external
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit + num_external
            if self.connector is not None and cacheable:
                # (Loaded before this step's forward pass, when num_external > 0.)
                self._connector_admitted(request, num_hit, num_external, not loaded)
            self.running.append(request)
            if self._max_per_group:
                self._group_running[request.group_id] = self._group_running.get(request.group_id, 0) + 1
            scheduled[request.request_id] = num_new
            admitted.add(request.request_id)
            budget -= num_new
            if credit is not None and remaining > 1:
                # (Without chunked prefill a whole prompt may overdraw it: never below 0, so
                # that one long prompt does not bar its client for many steps.)
                credit[request.client_key] = max(allowance - num_new, 0)
                client_tokens[request.request_id] = num_new
            if is_prefill:
                prefill_ids.add(request.request_id)
                if is_long:
                    long_ids.add(request.request_id)
                    largest_long = max(largest_long, num_new)
        if skipped:
            self.waiting.prepend(skipped)

        output = SchedulerOutput(
            num_batched_tokens=cfg.max_num_batched_tokens - budget,
            finished_request_ids=self._finished_ids,
            preempted_request_ids=self._preempted_ids + preempted if self._preempted_ids else preempted,
        )
        self._finished_ids = []
        self._preempted_ids = []
        requests = self.requests
        make = self._make_scheduled
        output.scheduled_requests = [
            make(requests[rid], num_new, rid in admitted, spec_of.get(rid, 0)) for rid, num_new in scheduled.items()
        ]
        if time_share is not None and scheduled:
            # A preempted long prefill's chunk left the step, but its size still says
            # what the step was meant to cost; good enough for a moving average.
            time_share.scheduled(output, contended, largest_long if long_ids else 0)
        return output

    def _external_tokens(self, request: Request, num_hit: int) -> tuple[int | None, bool]:
        """What the KV connector adds to a local prefix-cache hit at admission:
        ``(tokens, load_async)``; ``tokens`` is ``None`` while it does not know yet. A
        claim that reaches the last token is trimmed (computing it yields the first
        output token)."""
        assert self.connector is not None
        matched, load_async = self.connector.get_num_new_matched_tokens(request, num_hit)
        if matched is None:
            return None, False
        matched = max(0, min(matched, request.num_tokens - 1 - num_hit))
        return matched, load_async and matched > 0

    def _connector_admitted(self, request: Request, num_hit: int, num_external: int, count: bool) -> None:
        """Tell the connector an admitted request's blocks, and count the lookup (not
        again for a request back from its load)."""
        assert self.connector is not None
        if count:
            self._kv_stats.external_prefix_cache_queries += request.num_tokens - num_hit
            self._kv_stats.external_prefix_cache_hits += num_external
        self.connector.update_state_after_alloc(request, BlockIds(request.block_ids), num_external)

    def _apply_kv_output(self, out: KVConnectorOutput) -> dict[str, int]:
        """Take in what the workers' connectors reported for a step.

        Returns:
            Running requests whose loaded blocks failed, with the token count to go back
            to (the start of the first failed block): this step's results past it were
            computed over bad KV and are dropped.
        """
        assert self.connector is not None
        if out.stats is not None:
            self._kv_stats.add(out.stats)
        rolled_back: dict[str, int] = {}
        if out.invalid_block_ids:
            bad = set(out.invalid_block_ids)
            size = self.kv_cache_config.block_size
            holders = [r for r in self.running] + [r for r, _ in self._remote_loads.values()]
            failed: list[str] = []
            for request in holders:
                first = next((i for i, b in enumerate(request.block_ids) if b in bad), None)
                if first is None:
                    continue
                rid = request.request_id
                if self._fail_kv_loads:
                    logger.warning("request %s: KV blocks from %d on failed to load; failing it "
                                   "(kv_load_failure_policy 'fail')", rid, first)
                    failed.append(rid)
                    self._failed.append((rid, f"its KV cache failed to load from the KV connector "
                                              f"({type(self.connector).__name__}), and the server's "
                                              "kv_load_failure_policy is 'fail'"))
                    continue
                logger.warning("request %s: KV blocks from %d on failed to load; computing them instead",
                               rid, first)
                if rid in self._remote_loads:
                    self._remote_loads[rid] = (request, min(self._remote_loads[rid][1], first * size))
                elif request.num_computed_tokens > first * size:
                    rolled_back[rid] = first * size
            if failed:
                # (This step's tokens for them are then skipped: they are no longer running.)
                self.finish_requests(failed, FinishReason.ABORT)
        for rid in out.finished_recving:
            loading = self._remote_loads.pop(rid, None)
            if loading is not None:
                request, computed = loading
                request.status = RequestStatus.WAITING
                request.num_computed_tokens = computed
                self.waiting.prepend([request])  # it was admitted already: first in line
            else:
                self._kv_done(rid, "recv")
        for rid in out.finished_sending:
            self._kv_done(rid, "send")
        self.connector.update_connector_output(out)
        return rolled_back

    def _kv_done(self, rid: str, use: str) -> None:
        """A finished request's blocks are no longer used for ``use``: freed if nothing else
        uses them. (A report for a request the scheduler is not waiting on is ignored.)"""
        busy = self._kv_busy.get(rid)
        if busy is None:
            return
        busy[1].discard(use)
        if not busy[1]:
            del self._kv_busy[rid]
            self.kv_cache_manager.free(busy[0])

    def _contended(self, threshold: int) -> bool:
        """Whether a request other than the long prefills is running or waiting."""
        for request in self.running:
            left = request.num_tokens + request.num_output_placeholders - request.num_computed_tokens
            if left <= 1 or request.num_prompt_tokens <= threshold:
                return True
        return any(request.num_prompt_tokens <= threshold for request in self.waiting)

    def kept_tokens(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput,
                    request_ids: Iterable[str]) -> list[tuple[str, list[int]]] | None:
        """See :meth:`SchedulerInterface.kept_tokens`: a row's sampled token, unless its
        request is no longer running (finished, aborted, preempted meanwhile). ``None``
        when a row has several tokens (verified drafts: a stop among them cuts them) or a
        KV connector reports on the step (its rollbacks)."""
        if runner_output.kv_connector_output is not None:
            return None
        requests = self.requests
        running = RequestStatus.RUNNING
        sampled = runner_output.sampled_token_ids
        kept: list[tuple[str, list[int]]] = []
        # Over the ids asked for, not the plan's rows (at batch 256 this runs on the
        # constrained step's critical path): an id with no sampled token did not sample.
        for rid in request_ids:
            tokens = sampled.get(rid)
            if not tokens:
                continue
            request = requests.get(rid)
            if request is None or request.status is not running:
                continue
            if len(tokens) != 1:
                return None
            kept.append((rid, tokens))
        return kept

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        kv = self.kv_cache_manager
        if self._time_share is not None:
            self._time_share.done(scheduler_output)
        logprobs = runner_output.logprobs or {}
        prompt_logprobs = runner_output.prompt_logprobs or {}
        sampled = runner_output.sampled_token_ids
        drafts = runner_output.spec_token_ids or {}
        rolled_back: dict[str, int] = {}
        if self.connector is not None and runner_output.kv_connector_output is not None:
            rolled_back = self._apply_kv_output(runner_output.kv_connector_output)
        outputs: list[EngineCoreOutput] = []
        any_finished = False
        # Hoisted out of the loop: it runs once per request per step.
        requests = self.requests
        running = RequestStatus.RUNNING
        cache_blocks = kv.cache_blocks if kv.enable_caching else None
        for item in scheduler_output.scheduled_requests:
            request = requests.get(item.request_id)
            if request is None or request.status is not running:
                continue  # aborted while the step ran
            if rolled_back and request.request_id in rolled_back:
                # Its loaded KV was bad: recompute from the first bad block; whatever this
                # step sampled for it is dropped.
                request.num_computed_tokens = rolled_back[request.request_id]
                request.num_cached_tokens = min(request.num_cached_tokens, request.num_computed_tokens)
                request.num_output_placeholders = 0
                request.spec_token_ids = []
                self._drafted.discard(request.request_id)
                continue
            if cache_blocks is not None:
                # The step computed these blocks; only now may other requests hit them.
                # (With async scheduling num_computed_tokens may count a position whose
                # token is still in flight: it cannot be hashed yet.)
                cache_blocks(request, min(request.num_computed_tokens, request.num_tokens))
            if not item.sample:
                continue
            if request.pooling_params is not None:
                outputs.append(self._finish_pooling(request, runner_output))
                any_finished = True
                continue
            token_ids = sampled.get(item.request_id)
            if not token_ids:
                # Skipping would leave the request with nothing to compute: it would hang.
                raise RuntimeError(
                    f"the model runner returned no token for request {item.request_id!r}, "
                    "which was scheduled with sample=True"
                )
            if request.num_output_placeholders:
                request.num_output_placeholders -= 1
            new_token_ids: list[int] = []
            status: RequestStatus | None = None
            kv_params = None
            for token_id in token_ids:
                request.append_output_token(token_id)
                new_token_ids.append(token_id)
                status = self._check_stop(request, token_id)
                if status is not None:
                    break
            if status is not None:
                kv_params = self._finish(request, status)
                any_finished = True
            else:
                if item.num_spec_tokens:
                    # The drafts the target rejected were computed at positions that now
                    # hold other tokens: computed again, from the first rejected one.
                    request.num_computed_tokens -= item.num_spec_tokens + 1 - len(token_ids)
                request.spec_token_ids = drafts.get(item.request_id, [])
                if request.spec_token_ids:
                    self._drafted.add(request.request_id)
                else:
                    self._drafted.discard(request.request_id)
            outputs.append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=new_token_ids,
                    finish_reason=request.finish_reason,
                    num_cached_tokens=max(request.num_cached_tokens, 0),
                    new_logprobs=logprobs.get(request.request_id),
                    stop_reason=request.stop_reason,
                    new_prompt_logprobs=prompt_logprobs.get(request.request_id),
                    kv_transfer_params=kv_params,
                )
            )
        if any_finished:
            self.running = [r for r in self.running if not r.is_finished]
        return outputs

    def _finish_pooling(self, request: Request, runner_output: ModelRunnerOutput) -> EngineCoreOutput:
        """A pooling request's prompt ran: it finishes with its pooled values."""
        pooled = (runner_output.pooler_output or {}).get(request.request_id)
        if pooled is None:
            raise RuntimeError(f"the model runner returned no pooled output for pooling request "
                               f"{request.request_id!r}, whose whole prompt it ran")
        request.num_output_placeholders = 0
        kv_params = self._finish(request, RequestStatus.FINISHED_STOPPED)
        # Its prefix-cache hits as for a generation request (0 while the engine turns
        # prefix caching off for pooling models).
        return EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                finish_reason=request.finish_reason, pooling_output=pooled,
                                num_cached_tokens=max(request.num_cached_tokens, 0),
                                kv_transfer_params=kv_params)

    # ---------------------------------------------------------------------------- stats

    def make_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            kv_transfer=dataclasses.replace(self._kv_stats) if self.connector is not None else None,
        )

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        if reset_running_requests:
            # Latest first, as preemption goes; each restarts from its first token (a token
            # of it still in flight is dropped, as for any preemption).
            for request in sorted(self.running, key=self._preemption_key, reverse=True):
                self._preempt(request)
                self._preempted_ids.append(request.request_id)
        return self.kv_cache_manager.reset_prefix_cache()

    # -------------------------------------------------------------------------- helpers

    def _preemption_key(self, request: Request) -> tuple[float, ...]:
        # The maximum is preempted: the lowest priority, then the latest arrival.
        seq = self._arrival_seq[request.request_id]
        if self.scheduler_config.policy == "priority":
            return (request.priority, request.arrival_time, seq)
        return (request.arrival_time, seq)

    def _left_running(self, request: Request) -> None:
        # Called for every request leaving `running` (preempted or finished while running).
        if self._max_per_group:
            left = self._group_running[request.group_id] - 1
            if left:
                self._group_running[request.group_id] = left
            else:
                del self._group_running[request.group_id]

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._left_running(request)
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        # Its table is freed; the runner drops its copy and gets a fresh one on readmission.
        request.num_block_ids_sent = 0
        # A token still in flight is dropped: recomputation samples it again.
        request.num_output_placeholders = 0
        request.spec_token_ids = []
        self._drafted.discard(request.request_id)
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add_preempted(request)

    def _finishes_with_pending(self, request: Request) -> bool:
        # Length limits are known before the tokens: a request whose in-flight tokens
        # reach max_tokens or max_model_len finishes when they arrive.
        pending = request.num_output_placeholders
        if request.max_tokens is not None and request.num_output_tokens + pending >= request.max_tokens:
            return True
        return request.num_tokens + pending >= self.max_model_len

    def _num_spec_tokens(self, request: Request, budget: int) -> int:
        """How many of a decoding request's drafts to verify this step: no more than the
        budget leaves after its own token, nor past ``max_tokens`` or ``max_model_len``
        (a token there would be cut anyway)."""
        room = min(len(request.spec_token_ids), budget - 1, self.max_model_len - request.num_tokens - 1)
        if request.max_tokens is not None:
            room = min(room, request.max_tokens - request.num_output_tokens - 1)
        return max(room, 0)

    def _make_scheduled(self, request: Request, num_new: int, is_new: bool, num_spec: int = 0) -> ScheduledRequest:
        start = request.num_computed_tokens
        end = start + num_new
        request.num_computed_tokens = end
        if num_spec:
            # The last known token, then the drafts (update_from_output rolls back the
            # positions of those the target rejects).
            token_ids = request.all_token_ids[start:end - num_spec] + request.spec_token_ids[:num_spec]
            sample = True
        else:
            token_ids = request.all_token_ids[start:end]
            if len(token_ids) < num_new:
                # Tokens sampled by the step in flight: the runner takes them on the device.
                token_ids.extend([PLACEHOLDER_TOKEN_ID] * (num_new - len(token_ids)))
            sample = end == request.num_tokens + request.num_output_placeholders
        if sample:
            request.num_output_placeholders += 1
        # Only the blocks the runner lacks: the whole table when (re)admitted, else those
        # appended since the last step that scheduled it (one per block_size tokens).
        block_ids = request.block_ids
        sent = 0 if is_new else request.num_block_ids_sent
        if sent > len(block_ids):
            # Deltas assume the table only grew while the request ran (see the module doc).
            raise RuntimeError(
                f"request {request.request_id!r}: its block table shrank from {sent} to "
                f"{len(block_ids)} blocks while it was running"
            )
        request.num_block_ids_sent = len(block_ids)
        item = ScheduledRequest(
            request_id=request.request_id,
            token_ids=token_ids,
            start_position=start,
            new_block_ids=block_ids[sent:] if sent < len(block_ids) else [],
            is_new=is_new,
            sample=sample,
            num_spec_tokens=num_spec,
        )
        if is_new:
            item.sampling_params = request.sampling_params
            item.pooling_params = request.pooling_params
            item.prompt_token_ids = list(request.prompt_token_ids)
            item.output_token_ids = list(request.output_token_ids)
        return item

    def _check_stop(self, request: Request, token_id: int) -> RequestStatus | None:
        # (Runs for every token of every request: the output length is read once.)
        num_output = len(request.output_token_ids)
        if num_output >= request.min_tokens:
            if token_id in request.eos_token_ids and not request.ignore_eos:
                return RequestStatus.FINISHED_STOPPED
            if token_id in request.stop_token_ids:
                request.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED
        max_tokens = request.max_tokens
        if max_tokens is not None and num_output >= max_tokens:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        if request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None

    def _finish(self, request: Request, status: RequestStatus) -> dict[str, Any] | None:
        """Finish ``request``; returns the connector's ``kv_transfer_params`` for the
        client (for the request's last output), or ``None``."""
        # The caller removes the request from `running` (in one pass for many requests).
        if request.status is RequestStatus.RUNNING:
            self._left_running(request)
        loading = request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
        request.status = status
        request.finish_reason = status.finish_reason
        keep, kv_params = False, None
        if self.connector is not None:
            keep, kv_params = self.connector.request_finished(request, request.block_ids)
            if kv_params is not None and not isinstance(kv_params, dict):
                raise TypeError(f"{type(self.connector).__name__}.request_finished returned kv_transfer_params "
                                f"of type {type(kv_params).__name__}: expected a dict or None")
        if keep or loading:
            # Freed when the workers report it done.
            uses = {use for use, busy in (("send", keep), ("recv", loading)) if busy}
            self._kv_busy[request.request_id] = (request, uses)
        else:
            self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        del self._arrival_seq[request.request_id]
        if self._max_per_client:
            left = self._client_requests[request.client_key] - 1
            if left:
                self._client_requests[request.client_key] = left
            else:
                del self._client_requests[request.client_key]
        self._history_dependent.discard(request.request_id)
        self._drafted.discard(request.request_id)
        self._finished_ids.append(request.request_id)
        return kv_params


def _reads_output_history(params: SamplingParams, grammar_deferred: bool = False) -> bool:
    """Whether sampling this request reads the tokens it generated so far: penalties,
    a seeded generator (reseeded from the output length), ``min_tokens``, ``bad_words``
    (matched against the end of the output), ``thinking_token_budget`` (its reasoning
    counted in the output) or structured outputs (the engine core's
    grammar must have accepted the previous token before it fills the next bitmask;
    not with ``grammar_deferred``, where it fills it after the plan)."""
    return (
        params.seed is not None
        or (params.structured_outputs is not None and not grammar_deferred)
        or params.min_tokens > 0
        or bool(params.bad_words)
        or params.thinking_token_budget is not None
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
        or params.repetition_penalty != 1.0
    )


def _skips_prefix_cache(params: SamplingParams) -> bool:
    """Whether a request must compute its whole prompt: prompt logprobs come from the
    logits of every prompt position, which a prefix-cache hit would skip (vLLM skips
    reading the cache for these requests too). Its blocks are still cached for others."""
    return params.prompt_logprobs is not None
