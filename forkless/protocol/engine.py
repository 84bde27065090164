"""Messages crossing the API-server <-> engine-core boundary (msgpack via msgspec).

The payload types are the engine core's own plain dataclasses (``EngineCoreOutput``,
``SchedulerStats``) and ``SamplingParams``, so nothing is converted twice. Encode with
``msgspec.msgpack.encode`` and decode with ``msgspec.msgpack.decode(data, type=...)``.
"""

from __future__ import annotations

import msgspec

from forkless.pooling_params import PoolingParams
from forkless.protocol.lora import LoRARequest
from forkless.protocol.step import EngineCoreOutput, SchedulerStats
from forkless.sampling_params import SamplingParams

# vLLM's pause modes (AsyncLLM.pause_generation and sleep, carried out by the engine core):
# what becomes of the requests in flight -- ended, let finish, or frozen until the resume.
PAUSE_MODES = ("abort", "wait", "keep")


def check_pause_mode(mode: str) -> None:
    """Raise ``ValueError`` naming ``mode`` unless it is one of :data:`PAUSE_MODES`."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"mode={mode!r} is invalid: expected one of {', '.join(map(repr, PAUSE_MODES))}")


class EngineCoreRequest(msgspec.Struct, kw_only=True):
    """One request for the engine core, already tokenized and validated.

    Attributes:
        request_id: Unique id within the engine (``n > 1`` children have their own).
        prompt_token_ids: The tokenized prompt.
        sampling_params: The request's parameters (``n == 1``; EOS ids filled in).
        eos_token_id: The model's EOS token, or ``None``.
        arrival_time: ``time.time()`` when the request arrived.
        priority: Lower runs first under ``--scheduling-policy priority``.
        cache_salt: Mixed into the request's prefix-cache hashes (vLLM's ``cache_salt``):
            it shares cached blocks only with requests of the same salt. ``None``: no salt.
        group_id: The request it is a sequence of (the ``n`` children and the prompts of
            one API request share it), for the scheduler's per-request limits
            (``--max-running-seqs-per-request``). ``None``: ``request_id``.
        lora_request: The LoRA adapter to run with (already checked by the processor);
            ``None``: the base model.
        client_key: Who sent it (the API server's ``user`` field or peer address), for
            the scheduler's per-client share (``--max-prefill-tokens-per-client``).
            ``None``: no client (the offline ``LLM``; all such requests are one client).
        pooling_params: Set for a pooling request (embeddings, classification, scores):
            it runs its prompt once and finishes with the pooled values, no token.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None
    group_id: str | None = None
    lora_request: LoRARequest | None = None
    client_key: str | None = None
    pooling_params: PoolingParams | None = None


class EngineCoreOutputs(msgspec.Struct, kw_only=True):
    """What one engine-core step produced.

    Attributes:
        outputs: One entry per request that produced tokens or finished.
        scheduler_stats: A snapshot for stat loggers (``None`` when not collected).
        timestamp: ``time.time()`` when the step finished.
        monotonic_timestamp: The same moment in the engine core's ``time.monotonic()``
            seconds, the clock of its request events (vLLM's ``EngineCoreOutputs.timestamp``
            is this one): per-request statistics measure first and last tokens with it.
    """

    outputs: list[EngineCoreOutput] = msgspec.field(default_factory=list)
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    monotonic_timestamp: float = 0.0

