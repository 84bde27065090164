"""Configuration of the scheduler and of the KV cache it manages.

Plain dataclasses so that the engine can build them from CLI flags or JSON and ship
them to the engine-core process as plain data. Every value is validated when the object
is built, in whichever process builds it, so a bad flag fails before any step runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from forkless.core.block_pool import HASH_ALGOS

SCHEDULING_POLICIES = ("fcfs", "priority")


def _check_positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


@dataclass(kw_only=True)
class SchedulerConfig:
    """How the scheduler batches requests.

    Attributes:
        max_model_len: Longest sequence (prompt + output) a request may reach.
        max_num_seqs: Most requests running (holding KV blocks) at once.
        max_num_batched_tokens: Token budget of one step (all requests together).
        policy: ``"fcfs"`` (arrival order) or ``"priority"`` (lower ``priority`` first,
            then arrival). Flag: ``--scheduling-policy``.
        enable_chunked_prefill: Split prompts longer than the remaining budget across
            steps. When off, ``max_num_batched_tokens`` must be >= ``max_model_len`` so
            that every prompt fits one step.
        long_prefill_token_threshold: When > 0, a prefill with more tokens left to compute
            than this is *long*, and no prefill chunk is longer than this: one long prompt
            then takes at most this many tokens of a step, leaving the rest of the budget
            to decodes and to newly arrived requests. 0 disables both (vLLM's meaning).
            Left at 0 with ``max_num_partial_prefills`` > 1, it becomes 4 % of
            ``max_model_len``, as in vLLM. Flag: ``--long-prefill-token-threshold``
            (``EngineArgs`` picks a CPU default, see ``forkless.config``).
        long_prefill_min_prompt_tokens: When > 0, a prompt of at most this many tokens is
            never long, whatever ``long_prefill_token_threshold`` says: it is scheduled whole
            (budget permitting) and not held to the long limits. A small chunk cap then keeps
            a long prompt's turns short without chunking ordinary prompts. 0: the threshold
            alone decides (vLLM's meaning). Flag: ``--long-prefill-min-prompt-tokens``
            (forkless only; ``EngineArgs`` picks a CPU default for the server).
        max_num_partial_prefills: Most requests prefilling in one step (with chunked
            prefill); ``None`` for no limit other than ``max_num_seqs`` and the budget.
            Flag: ``--max-num-partial-prefills``.
        max_long_partial_prefills: Of those, most *long* ones (see
            ``long_prefill_token_threshold``). A long prompt over this limit waits while
            shorter ones behind it are admitted. Flag: ``--max-long-partial-prefills``.
        long_prefill_time_share: When > 0 (and ``long_prefill_token_threshold`` > 0),
            while other requests run, long prefills take at most this share of the
            measured step time, in chunks of at most ``long_prefill_token_threshold``
            tokens sized to it; then the other requests take at most ``1 / (1 - share)``
            times as long as alone. A long prompt alone is not limited. 0: off (vLLM has
            no such limit). Flag: ``--long-prefill-time-share`` (forkless only).
        max_running_seqs_per_request: When > 0, most sequences of one request running at
            once (the ``n`` children and prompts sharing a ``Request.group_id``); the
            request's other sequences wait, and requests queued behind them are admitted
            first. One request for hundreds of sequences then takes a bounded part of each
            step, not every slot of ``max_num_seqs`` and a step hundreds of sequences long.
            0: no limit (vLLM has none). Flag: ``--max-running-seqs-per-request`` (forkless
            only; ``EngineArgs`` picks a CPU default for the server, see ``forkless.config``).
        max_prefill_tokens_per_client: When > 0, while requests of more than one client
            (``Request.client_key``) are running or waiting, the prompt tokens one client's
            requests compute: this many a step on average, at most twice this in one
            step (a credit earned every step). Its prompts that the credit does not cover
            wait, and other clients' requests queued behind them are admitted first. Many
            connections of one client then add a bounded amount of prefill to the steps,
            instead of a step as large as all their prompts. 0: no limit (vLLM has none).
            Flag: ``--max-prefill-tokens-per-client`` (forkless only; ``EngineArgs`` picks
            a CPU default for the server, see ``forkless.config``).
        async_scheduling: Schedule and launch step N+1 before step N's sampled tokens
            reach the host (they are fed to N+1 on the device), so that the host's work
            overlaps the device's. Flag: ``--async-scheduling``. Requests whose sampling
            reads their own output history (penalties, ``seed``, ``min_tokens``) and
            custom logits processors make the engine step synchronously while present.
        stream_interval: A streamed (``DELTA``) request's next output comes once this many
            of its tokens are new, its first and last at once; a request's own
            ``SamplingParams.stream_interval`` can only raise it. 1: every step's (the
            default). Read by the output processor (in the API server, or the offline
            engine), not by the scheduler: fewer, larger outputs cost the host less per
            token. Flag: ``--stream-interval`` (vLLM's).
    """

    max_model_len: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: str = "fcfs"
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    long_prefill_min_prompt_tokens: int = 0
    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int = 1
    long_prefill_time_share: float = 0.0
    max_running_seqs_per_request: int = 0
    max_prefill_tokens_per_client: int = 0
    async_scheduling: bool = False
    stream_interval: int = 1

    def __post_init__(self) -> None:
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"unknown scheduling policy {self.policy!r}; choose one of "
                f"{', '.join(SCHEDULING_POLICIES)}"
            )
        _check_positive(
            "SchedulerConfig",
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )
        if isinstance(self.stream_interval, bool) or not isinstance(self.stream_interval, int) \
                or self.stream_interval < 1:
            raise ValueError(f"SchedulerConfig.stream_interval must be an integer >= 1, got {self.stream_interval!r}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                "SchedulerConfig.long_prefill_token_threshold must be >= 0, got "
                f"{self.long_prefill_token_threshold}"
            )
        min_prompt = self.long_prefill_min_prompt_tokens
        if isinstance(min_prompt, bool) or not isinstance(min_prompt, int) or min_prompt < 0:
            raise ValueError("SchedulerConfig.long_prefill_min_prompt_tokens must be an integer >= 0 "
                             f"(0: the threshold alone decides), got {min_prompt!r}")
        _check_positive("SchedulerConfig", max_long_partial_prefills=self.max_long_partial_prefills)
        share = self.long_prefill_time_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share < 1.0:
            raise ValueError(f"SchedulerConfig.long_prefill_time_share must be in [0, 1), got {share!r}")
        per_request = self.max_running_seqs_per_request
        if isinstance(per_request, bool) or not isinstance(per_request, int) or per_request < 0:
            raise ValueError("SchedulerConfig.max_running_seqs_per_request must be an integer >= 0 "
                             f"(0: no limit), got {per_request!r}")
        per_client = self.max_prefill_tokens_per_client
        if isinstance(per_client, bool) or not isinstance(per_client, int) or per_client < 0:
            raise ValueError("SchedulerConfig.max_prefill_tokens_per_client must be an integer >= 0 "
                             f"(0: no limit), got {per_client!r}")
        partial = self.max_num_partial_prefills
        if partial is not None:
            _check_positive("SchedulerConfig", max_num_partial_prefills=partial)
            if self.max_long_partial_prefills > partial:
                raise ValueError(
                    f"max_long_partial_prefills ({self.max_long_partial_prefills}) must be <= "
                    f"max_num_partial_prefills ({partial})"
                )
            if partial > 1:
                if not self.enable_chunked_prefill:
                    raise ValueError("max_num_partial_prefills > 1 needs chunked prefill enabled")
                if self.long_prefill_token_threshold == 0:
                    # vLLM's default: "long" must mean something once several prefills share a step.
                    self.long_prefill_token_threshold = int(self.max_model_len * 0.04)
                if self.long_prefill_token_threshold > self.max_model_len:
                    raise ValueError(
                        f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) "
                        f"cannot be greater than max_model_len ({self.max_model_len})"
                    )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({self.max_model_len}) with chunked prefill disabled: long "
                "prompts could never be scheduled; raise it or enable chunked prefill"
            )


@dataclass(kw_only=True)
class KVCacheConfig:
    """Shape of the paged KV cache, as the scheduler sees it.

    Attributes:
        num_blocks: Number of KV-cache blocks the model runner allocated.
        block_size: Tokens per block.
        enable_prefix_caching: Reuse the KV of full blocks shared by requests' prefixes.
        prefix_caching_hash_algo: ``"sha256"`` (the default, as in vLLM),
            ``"sha256_cbor"`` or ``"builtin"`` (fast, not collision-resistant); see
            :func:`forkless.core.block_pool.hash_block_tokens`. Flag:
            ``--prefix-caching-hash-algo``.
    """

    num_blocks: int
    block_size: int = 16
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"

    def __post_init__(self) -> None:
        _check_positive("KVCacheConfig", num_blocks=self.num_blocks, block_size=self.block_size)
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise ValueError(
                f"unknown prefix_caching_hash_algo {self.prefix_caching_hash_algo!r}; choose "
                f"one of {', '.join(HASH_ALGOS)}"
            )
