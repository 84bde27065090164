"""The engine core's view of one generation request.

A :class:`Request` is owned by the scheduler: it tracks where the request is in its
lifecycle, which tokens it has (prompt + generated), how many of them have KV computed,
and which KV-cache blocks hold them. Sampling itself happens in the model runner; the
request only keeps the few sampling fields that decide when generation stops.
"""

from __future__ import annotations

import enum
import time
from typing import Any, Hashable, Iterable

from forkless.pooling_params import PoolingParams
from forkless.protocol.step import FinishReason
from forkless.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request inside the scheduler.

    The finished states sort after the live ones, so ``status > PREEMPTED`` means done.
    """

    WAITING = enum.auto()
    # Admitted with blocks, which a KV connector is filling between steps; it runs (as
    # WAITING again, first in line) once the worker reports the load done.
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    # Evicted to free KV blocks; waits again and recomputes (prompt + output) on readmission.
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        """Whether this is one of the FINISHED_* states."""
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> FinishReason | None:
        """The :class:`FinishReason` of a finished state, else ``None``."""
        return _FINISH_REASONS.get(self)

    @staticmethod
    def from_finish_reason(reason: FinishReason | str) -> RequestStatus:
        """The FINISHED_* state that reports ``reason``."""
        return _FINISHED_STATUS[FinishReason(reason)]


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
}
_FINISHED_STATUS = {reason: status for status, reason in _FINISH_REASONS.items()}


class Request:
    """One request as the scheduler and the KV-cache manager see it.

    Args:
        request_id: Unique id of the request within the engine.
        prompt_token_ids: The tokenized prompt (must not be empty).
        sampling_params: The request's ``SamplingParams``; the scheduler reads its stop
            fields and passes it through to the model runner untouched.
        eos_token_id: The model's EOS token, or ``None`` when it has none. EOS ids listed
            in ``sampling_params.eos_token_ids`` stop generation too.
        arrival_time: When the request arrived (any monotonic clock); defaults to now.
        priority: Scheduling priority under the ``priority`` policy; lower runs first.
        cache_salt: Extra key mixed into the prefix-cache hashes (a LoRA adapter name,
            a tenant salt...). Requests only share cached blocks when their salts match.
        group_id: The request this one is a sequence of: the ``n`` children of a request
            and the prompts of one API request share it, and the scheduler's
            ``max_running_seqs_per_request`` counts them together. Default: ``request_id``
            (a group of its own).
        client_key: Who sent it; the scheduler's ``max_prefill_tokens_per_client`` shares
            a step's prefill among clients. ``None``: no client (one client, the offline
            engine's).
        pooling_params: Set for a pooling request: its whole prompt runs in one step,
            after which it finishes with the pooled values (no token is sampled).

    Attributes:
        status: Where the request is in its lifecycle.
        output_token_ids: Tokens generated so far.
        num_computed_tokens: Leading tokens of ``all_token_ids`` whose KV is computed
            (or scheduled to be computed by the step in flight).
        num_cached_tokens: Prompt tokens found in the prefix cache when the request was
            first admitted; -1 until then.
        block_ids: The request's block table (KV-cache block ids, in token order).
        num_block_ids_sent: Leading ``block_ids`` the model runner already holds (sent in
            earlier steps since the request was last admitted); the next step sends only
            the rest. 0 while the request holds no blocks.
        block_hashes: Prefix-cache hashes of the request's full blocks, filled lazily by
            the KV-cache manager; valid across preemption since full blocks never change.
        finish_reason: Set once the request is finished.
        stop_reason: The stop token id that ended the request, if one did.
        num_preemptions: How many times the request was preempted.
        kv_transfer_params: What the client passed to the KV connector
            (``sampling_params.extra_args["kv_transfer_params"]``, vLLM's place for it; the
            body field of the same name on the server), or ``None``. Connectors read it
            in ``get_num_new_matched_tokens`` to pair this request with another engine's.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: Hashable | None = None,
        group_id: str | None = None,
        client_key: str | None = None,
        pooling_params: PoolingParams | None = None,
    ) -> None:
        self.request_id = request_id
        self.pooling_params = pooling_params
        self.group_id = request_id if group_id is None else group_id
        self.client_key = client_key
        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority
        self.cache_salt = cache_salt

        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        # One list for prompt + output so the hot path never concatenates.
        self._all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        # Tokens scheduled to be sampled but not yet back on the host (one while a step
        # that samples this request is in flight); their positions are already counted
        # in num_computed_tokens by the step that feeds them (async scheduling).
        self.num_output_placeholders = 0
        # Draft tokens the worker's speculative proposer guessed after the last step; the
        # next step computes them after the last token, and the target keeps what it agrees with.
        self.spec_token_ids: list[int] = []
        self.num_cached_tokens = -1
        self.block_ids: list[int] = []
        self.num_block_ids_sent = 0
        self.block_hashes: list[Hashable] = []
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | None = None
        self.num_preemptions = 0
        extra = sampling_params.extra_args
        self.kv_transfer_params: dict[str, Any] | None = extra.get("kv_transfer_params") if extra else None

        # Cached once: the stop checks run for every sampled token.
        self.max_tokens: int | None = sampling_params.max_tokens
        self.min_tokens: int = sampling_params.min_tokens
        self.ignore_eos: bool = sampling_params.ignore_eos
        self.stop_token_ids: frozenset[int] = frozenset(sampling_params.stop_token_ids or ())
        eos = set(sampling_params.eos_token_ids or ())
        if eos_token_id is not None:
            eos.add(eos_token_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by output tokens. Do not mutate: use :meth:`append_output_token`."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        """Length of prompt + output."""
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Number of generated tokens."""
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        """Whether the request reached a FINISHED_* state."""
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        """Record one generated token.

        Args:
            token_id: The sampled token.
        """
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"prompt={self.num_prompt_tokens}, output={self.num_output_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_ids)})"
        )
