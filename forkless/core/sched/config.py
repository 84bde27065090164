"""Configuration of the scheduler and of the KV cache it manages.

Plain dataclasses so that the engine can build them from CLI flags or JSON and ship
them to the engine-core process as plain data.
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
        long_prefill_token_threshold: When > 0, no prefill chunk is longer than this, so
            one long prompt cannot starve the decodes that share its steps.
        async_scheduling: Schedule and launch step N+1 before step N's sampled tokens
            reach the host (they are fed to N+1 on the device), so that the host's work
            overlaps the device's. Flag: ``--async-scheduling``. Requests whose sampling
            reads their own output history (penalties, ``seed``, ``min_tokens``) and
            custom logits processors make the engine step synchronously while present.
    """

    max_model_len: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: str = "fcfs"
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    async_scheduling: bool = False

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
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                "SchedulerConfig.long_prefill_token_threshold must be >= 0, got "
                f"{self.long_prefill_token_threshold}"
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
        prefix_caching_hash_algo: ``"builtin"`` or ``"sha256"``; see
            :func:`forkless.core.block_pool.hash_block_tokens`.
    """

    num_blocks: int
    block_size: int = 16
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "builtin"

    def __post_init__(self) -> None:
        _check_positive("KVCacheConfig", num_blocks=self.num_blocks, block_size=self.block_size)
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise ValueError(
                f"unknown prefix_caching_hash_algo {self.prefix_caching_hash_algo!r}; choose "
                f"one of {', '.join(HASH_ALGOS)}"
            )
