"""One engine step, as plain data: scheduler -> model runner -> scheduler -> engine.

Invariants:
    * Dataclasses and msgspec structs of ints, strings, lists, ``SamplingParams`` and
      opaque logprobs only, so that msgspec encodes them to msgpack and decodes them back
      into these exact types (``msgspec.msgpack.decode(data, type=SchedulerOutput)``):
      no dict -> object step. The per-request, per-step ones (``ScheduledRequest``,
      ``EngineCoreOutput``) are array-like structs, for the wire's size and the decode.
    * This module imports nothing of forkless but ``forkless.sampling_params``,
      ``forkless.pooling_params``, ``forkless.protocol.lora`` and
      ``forkless.protocol.kv_transfer``: executors, workers, the scheduler and stat
      loggers all import it, so it sits below all of them.
    * A step's size follows what changed, not what exists: a running request's
      ``ScheduledRequest`` carries only the block ids appended since it was last
      scheduled (``new_block_ids``, as vLLM's ``CachedRequestData``); its whole block table
      crosses once, when it is (re)admitted. The runner keeps each request's table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import msgspec

from forkless.pooling_params import PooledData, PoolingParams
from forkless.protocol.kv_transfer import KVConnectorOutput, KVTransferStats
from forkless.protocol.lora import LoRARequest
from forkless.sampling_params import SamplingParams


class FinishReason(str, enum.Enum):
    """Why a request stopped; the values are the OpenAI ``finish_reason`` strings."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"

    def __str__(self) -> str:
        return self.value


# Stands in ScheduledRequest.token_ids for a token that the previous step samples and
# that has not reached the host yet (async scheduling): the runner feeds that step's
# sampled id, still on the device, in its place.
PLACEHOLDER_TOKEN_ID = -1


class ScheduledRequest(msgspec.Struct, array_like=True, gc=False):
    """One request's work in one step.

    One per scheduled request per step, hundreds a step, and decoded by every worker
    before it can launch the step: encoded as an array (no field names on the wire: a
    decode step of 256 requests is 11 KB instead of 52 KB, and decodes in ~0.1 ms instead
    of ~0.4 ms on a 2-core EPYC) and never tracked by the garbage collector (it holds no
    cycles). Constructed like a dataclass, positionally or by name.

    Attributes:
        request_id: The request.
        token_ids: The tokens to compute this step, in position order;
            ``PLACEHOLDER_TOKEN_ID`` for one sampled by the step still in flight.
        start_position: Position of ``token_ids[0]`` (the request's computed tokens
            before this step, prefix-cache hits included).
        new_block_ids: Block ids, in token order, that the runner does not hold yet for
            this request. With ``is_new``: its whole block table (a readmitted request
            recomputes into a fresh table; vLLM's ``NewRequestData.block_ids``). Otherwise:
            the ids appended to its table since the step that last scheduled it, usually
            none (vLLM's ``CachedRequestData.new_block_ids``). The runner appends them to
            the table it keeps per request, which then holds enough blocks for
            ``start_position + len(token_ids)`` tokens. Deltas suffice because a running
            request's table only grows: the KV-cache manager appends to it (prefix-cache
            hits only at admission) and frees it only whole, at finish or preemption, which
            the runner learns from ``finished_request_ids`` / ``preempted_request_ids``.
        is_new: First step since (re)admission. The runner (re)registers the request from
            this entry, replacing any state (block table included) it still holds under
            this id.
        sample: This step reaches the end of the known tokens: the runner must sample
            one token for the request and return it in ``ModelRunnerOutput``.
        sampling_params: The request's sampling parameters; only when ``is_new``.
        prompt_token_ids: The original prompt; only when ``is_new``.
        output_token_ids: Tokens generated before this admission (non-empty after a
            preemption; penalties need them); only when ``is_new``.
        lora_request: The LoRA adapter the request runs with (``None``: the base model);
            only when ``is_new``.
        num_spec_tokens: The last this many of ``token_ids`` are draft tokens (speculative
            decoding) to verify: the runner scores every position and returns the drafts
            the target agrees with, then its own next token (``sample`` is set).
        pooling_params: Set for a pooling request (only when ``is_new``): its whole
            prompt is in this step and ``sample`` is set; the runner pools the hidden
            states and returns ``ModelRunnerOutput.pooler_output`` instead of a token.
    """

    request_id: str
    token_ids: list[int]
    start_position: int
    new_block_ids: list[int]
    is_new: bool
    sample: bool
    sampling_params: SamplingParams | None = None
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None
    lora_request: LoRARequest | None = None
    num_spec_tokens: int = 0
    pooling_params: PoolingParams | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens computed for this request this step."""
        return len(self.token_ids)


@dataclass
class SchedulerOutput:
    """One step's plan, for the model runner.

    Attributes:
        scheduled_requests: The batch, in order: running requests first, then admissions.
        num_batched_tokens: Sum of ``len(token_ids)`` over the batch.
        finished_request_ids: Requests that finished or were aborted since the previous
            step; the runner drops their state (ids it never saw are ignored).
        preempted_request_ids: Requests preempted by this step; the runner drops their
            state too. They come back later with ``is_new`` set.
        structured_output_request_ids: The requests of ``grammar_bitmask``'s rows, in
            order (constrained requests that sample this step).
        grammar_bitmask: Structured outputs: the bytes of a C-ordered int32 array of
            ``ceil(vocab_size / 32)``-word rows, ``1 + num_spec_tokens`` consecutive rows
            per request of ``structured_output_request_ids`` (one per position it
            samples or verifies: row ``j`` is what its grammar allows after its first
            ``j`` drafts; a row after a draft the grammar refuses repeats the row that
            refuses it); bit ``t % 32`` of word ``t // 32`` set allows token ``t``. The
            runner sets every other logit of those positions to ``-inf`` before sampling
            and verifying. ``None``: no constrained request samples this step, or
            ``defer_sampling``. In the engine core's process it is a buffer that the next
            step's plan reuses: a ``bytearray``, or the in-process worker's pinned memory
            as a numpy ``uint8`` array (``Executor.allocate_bitmask_buffer``); bytes once
            decoded from the wire.
        defer_sampling: Structured outputs under async scheduling: the plan was made
            while the step before was still running, so its constrained rows' bitmask
            (one row each, no drafts) comes later. The runner computes the logits and
            samples only once ``sample_deferred`` brings the bitmask (the engine core
            advances the grammars and fills it, on its fill thread, while the device runs
            the forward).
        grammar_tokens_to: With ``defer_sampling``, where the grammar process (or
            processes) has the output rank's worker send the step's sampled tokens itself
            once it has them: ``(fill id, addresses)``, each address a ZeroMQ PUSH peer for
            :func:`forkless.protocol.shared_memory.grammar_tokens_message`, the tokens in the
            order of ``structured_output_request_ids``. The grammars then advance without
            the tokens' trip through the engine core, which is on the chain from one
            step's tokens to the next step's sampling. ``None``: the engine core hands the
            grammars the tokens (``Executor.routes_grammar_tokens`` is off, or a grammar's
            backend cannot tell completion from its tokens).
        kv_connector_metadata: With a KV connector (``--kv-transfer-config``): its
            scheduler side's plan for this step (what to load and save), msgpack-encoded
            (``forkless.kv_transfer``); the workers' connectors decode it. Present even
            in a step without scheduled requests, which may still start loads.
    """

    scheduled_requests: list[ScheduledRequest] = field(default_factory=list)
    num_batched_tokens: int = 0
    finished_request_ids: list[str] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)
    structured_output_request_ids: list[str] = field(default_factory=list)
    grammar_bitmask: bytes | None = None
    defer_sampling: bool = False
    grammar_tokens_to: tuple[int, list[str]] | None = None
    kv_connector_metadata: bytes | None = None

    @property
    def is_empty(self) -> bool:
        """No work to run (the bookkeeping lists may still need forwarding)."""
        return not self.scheduled_requests

    # vLLM's views of the same plan, for KV connectors (and schedulers' consumers) ported
    # from vLLM; computed from scheduled_requests, never sent.
    @property
    def scheduled_new_reqs(self) -> list[NewRequestData]:
        """vLLM's ``scheduled_new_reqs``: the requests (re)admitted this step."""
        return [NewRequestData(r.request_id, r.prompt_token_ids, r.sampling_params, r.pooling_params,
                               (list(r.new_block_ids),), r.start_position, r.lora_request)
                for r in self.scheduled_requests if r.is_new]

    @property
    def scheduled_cached_reqs(self) -> CachedRequestData:
        """vLLM's ``scheduled_cached_reqs``: the running requests scheduled again."""
        cached = [r for r in self.scheduled_requests if not r.is_new]
        return CachedRequestData(
            req_ids=[r.request_id for r in cached], resumed_req_ids=set(),
            new_token_ids=[[] for _ in cached],
            new_block_ids=[(list(r.new_block_ids),) if r.new_block_ids else None for r in cached],
            num_computed_tokens=[r.start_position for r in cached])

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        """vLLM's ``num_scheduled_tokens``: request id -> tokens computed this step."""
        return {r.request_id: len(r.token_ids) for r in self.scheduled_requests}

    @property
    def total_num_scheduled_tokens(self) -> int:
        """vLLM's name of :attr:`num_batched_tokens`."""
        return self.num_batched_tokens

    @property
    def finished_req_ids(self) -> set[str]:
        """vLLM's ``finished_req_ids``."""
        return set(self.finished_request_ids)


@dataclass
class NewRequestData:
    """vLLM's record of a request scheduled for the first time since its (re)admission
    (:attr:`SchedulerOutput.scheduled_new_reqs`).

    Attributes:
        req_id: The request.
        prompt_token_ids: Its prompt.
        sampling_params: Its sampling parameters (``None``: a pooling request).
        pooling_params: Its pooling parameters (``None``: a generation request).
        block_ids: Its block table, one list per KV-cache group (here one).
        num_computed_tokens: Tokens computed before this step (prefix-cache hits included).
        lora_request: Its LoRA adapter, if any.
    """

    req_id: str
    prompt_token_ids: list[int] | None
    sampling_params: SamplingParams | None
    pooling_params: PoolingParams | None
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    lora_request: LoRARequest | None = None


@dataclass
class CachedRequestData:
    """vLLM's record of the running requests scheduled again
    (:attr:`SchedulerOutput.scheduled_cached_reqs`), one entry per request in each list.

    Attributes:
        req_ids: The requests.
        resumed_req_ids: Those back from preemption (none here: a readmitted request is new).
        new_token_ids: vLLM fills these only under pipeline parallelism; empty lists here.
        new_block_ids: Blocks appended to each table since it was last scheduled, one list
            per KV-cache group, or ``None`` when none were.
        num_computed_tokens: Tokens computed before this step.
    """

    req_ids: list[str]
    resumed_req_ids: set[str]
    new_token_ids: list[list[int]]
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]


@dataclass
class SpecDecodeStats:
    """What one step's speculative verification did (vLLM's counters).

    Attributes:
        num_drafts: Requests that had drafts to verify.
        num_draft_tokens: Draft tokens verified.
        num_accepted_tokens: Draft tokens the target agreed with.
        num_accepted_tokens_per_pos: Accepted drafts by position (index 0: the first
            draft of a request), as long as ``num_speculative_tokens``.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def add(self, other: SpecDecodeStats) -> None:
        """Add another step's counts to these."""
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        per_pos = self.num_accepted_tokens_per_pos
        per_pos.extend([0] * (len(other.num_accepted_tokens_per_pos) - len(per_pos)))
        for j, n in enumerate(other.num_accepted_tokens_per_pos):
            per_pos[j] += n


@dataclass
class ModelRunnerOutput:
    """What the model runner produced for one step.

    Attributes:
        sampled_token_ids: For each request scheduled with ``sample``, the token(s)
            sampled for it, in order.
        logprobs: Optional per-request logprobs; opaque to the scheduler, which passes
            them through to the matching :class:`EngineCoreOutput`.
        prompt_logprobs: Per request that asked for ``prompt_logprobs``, all of them at
            once, in the step that samples its first token after the prompt: one
            ``[token_ids, logprobs, rank]`` (prompt token first, then the top-k) per
            prompt position 1.. (``None`` for a position that was not computed).
            Opaque to the scheduler, which passes them through like ``logprobs``.
        lora_loads: LoRA adapters the worker has loaded from disk so far (cumulative;
            0 without ``--enable-lora``).
        lora_evictions: Adapters it evicted from its host cache so far (``--max-cpu-loras``).
        failed_requests: Requests the worker could not run, with the reason (their LoRA
            adapter failed to load): the engine core finishes them with that error; the
            step's other requests ran.
        spec_token_ids: Speculative decoding: per request, the draft tokens the proposer
            guessed for the next step (absent: none).
        spec_stats: Speculative decoding: what this step's verification accepted.
        pooler_output: Per pooling request scheduled with ``sample``, its pooled values.
        kv_connector_output: With a KV connector: the transfers that ended this step.
    """

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, Any] | None = None
    prompt_logprobs: dict[str, Any] | None = None
    lora_loads: int = 0
    lora_evictions: int = 0
    failed_requests: dict[str, str] | None = None
    spec_token_ids: dict[str, list[int]] | None = None
    spec_stats: SpecDecodeStats | None = None
    pooler_output: dict[str, PooledData] | None = None
    kv_connector_output: KVConnectorOutput | None = None


class EngineCoreEventType(enum.IntEnum):
    """What happened to a request in the engine core (vLLM's ``EngineCoreEventType``)."""

    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


class EngineCoreEvent(msgspec.Struct, array_like=True, gc=False):
    """One lifecycle event of a request, as vLLM's ``EngineCoreEvent``.

    Recorded only when the engine core is asked to (``EngineCore(log_stats=True)``: the
    offline ``LLM(disable_log_stats=False)``, or the server's engine core when the API
    server keeps statistics), and carried by the request's next output.

    Attributes:
        type: What happened.
        timestamp: When, in the engine core's ``time.monotonic()`` seconds.
    """

    type: EngineCoreEventType
    timestamp: float


class EngineCoreOutput(msgspec.Struct, array_like=True, gc=False):
    """News about one request after a step, for the engine / API server.

    One per running request per step, hundreds a step: encoded as an array (no field
    names on the wire) and never tracked by the garbage collector (it holds no cycles),
    so that the API server's collections do not scan a step's worth of them.

    Attributes:
        request_id: The request.
        new_token_ids: Tokens generated this step (all kept, the stopping one included).
        finish_reason: Set when the request finished this step, else ``None``.
        num_cached_tokens: Prompt tokens served from the prefix cache at admission.
        new_logprobs: The runner's logprobs for this request this step, untouched.
        new_prompt_logprobs: The runner's prompt logprobs for this request, untouched
            (only in the output of its first sampled token).
        stop_reason: The ``stop_token_ids`` entry that finished it, if one did (``None``
            when EOS did, as in vLLM).
        pooling_output: A pooling request's pooled values (it finishes in that output).
        events: The request's lifecycle events since its previous output (queued,
            scheduled, preempted), or ``None``: only when the engine core records them.
        kv_transfer_params: In the output that finishes the request, what the KV
            connector's ``request_finished`` returned for the client (vLLM's hand-over to
            the engine that continues the request), else ``None``.
    """

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    num_cached_tokens: int = 0
    new_logprobs: Any = None
    stop_reason: int | None = None
    new_prompt_logprobs: Any = None
    pooling_output: PooledData | None = None
    events: list[EngineCoreEvent] | None = None
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        """Whether the request is done."""
        return self.finish_reason is not None


@dataclass
class PrefixCacheStats:
    """vLLM's prefix-cache counters over an interval (``SchedulerStats.prefix_cache_stats``).

    Attributes:
        reset: Whether the prefix cache was reset in the interval (never reported here).
        requests: Requests looked up (not counted here: 0).
        queries: Prompt tokens looked up.
        hits: Of those, tokens found.
    """

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0


@dataclass
class SchedulerStats:
    """A snapshot for stat loggers.

    Attributes:
        num_running: Requests holding KV blocks.
        num_waiting: Requests queued (new or preempted).
        kv_cache_usage: Fraction of KV blocks referenced by requests.
        prefix_cache_queries: Tokens looked up in the prefix cache so far (cumulative).
        prefix_cache_hits: Of those, tokens found (cumulative).
        num_preemptions: Preemptions so far (cumulative).
        running_lora_adapters: LoRA adapter name -> its running requests (with
            ``--enable-lora``; adapters without running requests are left out).
        waiting_lora_adapters: LoRA adapter name -> its waiting requests.
        lora_loads: LoRA adapters loaded by the workers so far (cumulative).
        lora_evictions: Adapters evicted from the workers' host caches so far (cumulative).
        spec_decode: Speculative decoding's counters so far (cumulative), or ``None``
            without ``--speculative-config``.
        kv_transfer: The KV connector's counters so far (cumulative), or ``None``
            without ``--kv-transfer-config``.
    """

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    running_lora_adapters: dict[str, int] = field(default_factory=dict)
    waiting_lora_adapters: dict[str, int] = field(default_factory=dict)
    lora_loads: int = 0
    lora_evictions: int = 0
    spec_decode: SpecDecodeStats | None = None
    kv_transfer: KVTransferStats | None = None
    # vLLM's per-interval views, filled by the API server before the stat loggers see the
    # snapshot (the change since the snapshot they saw before): None in the engine core.
    prefix_cache_stats: PrefixCacheStats | None = None
    spec_decoding_stats: SpecDecodeStats | None = None
    step_counter: int = 0

    @property
    def current_wave(self) -> int:
        """vLLM's data-parallel wave: always 0 (no data parallelism)."""
        return 0

    @property
    def kv_connector_stats(self) -> dict[str, Any] | None:
        """vLLM's connector-specific stats: none here (the KV connector's counters are
        ``kv_transfer``)."""
        return None

    @property
    def connector_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """vLLM's prefix-cache stats of the KV connector: none here."""
        return None

    @property
    def num_running_reqs(self) -> int:
        """``num_running`` under vLLM's name (stat loggers ported from vLLM read it)."""
        return self.num_running

    @property
    def num_waiting_reqs(self) -> int:
        """``num_waiting`` under vLLM's name."""
        return self.num_waiting
