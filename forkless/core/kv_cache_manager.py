"""Per-request block tables over the block pool, with prefix caching.

The manager decides *which* blocks a request's tokens live in; the model runner owns the
memory and only ever sees block ids. A block joins the prefix cache once it is full and
its KV has been computed (see :meth:`KVCacheManager.cache_blocks`), never earlier, so a
cache hit can never read KV that the step in flight is still writing.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Sequence

from forkless.core.block_pool import BlockPool, extend_block_hashes

if TYPE_CHECKING:
    from forkless.core.block_pool import KVCacheBlock
    from forkless.core.request import Request
    from forkless.core.sched.config import KVCacheConfig


class KVCacheInvariantError(AssertionError):
    """The block bookkeeping is inconsistent (a leak, a double free...)."""


class KVCacheManager:
    """Allocates and frees KV-cache blocks for requests.

    Args:
        config: Number of blocks, block size, and prefix-caching settings.

    Attributes:
        hash_algo: How full blocks are hashed (``--prefix-caching-hash-algo``).
        prefix_cache_queries: Tokens looked up in the prefix cache at admissions.
        prefix_cache_hits: Of those, tokens found cached.
    """

    def __init__(self, config: KVCacheConfig) -> None:
        self.block_size = config.block_size
        self.enable_caching = config.enable_prefix_caching
        self.hash_algo = config.prefix_caching_hash_algo
        self.pool = BlockPool(config.num_blocks)
        self._tables: dict[str, list[KVCacheBlock]] = {}
        self._requests: dict[str, Request] = {}
        # Leading blocks of each table already offered to the cache index; never revisited.
        self._num_committed: dict[str, int] = {}
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_blocks(self) -> int:
        """Total number of blocks."""
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks available to new allocations (free plus evictable cached ones)."""
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by some request (cached-free ones count as free)."""
        return 1.0 - self.pool.num_free_blocks / self.pool.num_blocks

    def get_block_ids(self, request_id: str) -> list[int]:
        """The block table of a request (empty when it holds none)."""
        return [b.block_id for b in self._tables.get(request_id, ())]

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Find the longest cached prefix of a request that is being admitted.

        At least the last token is always left out, because computing it is what
        produces the logits of the next token.

        The blocks are not reserved: pass them straight to :meth:`allocate_slots`
        before anything else allocates.

        Args:
            request: A request without blocks (new or preempted).

        Returns:
            ``(block_ids, num_cached_tokens)``; ``([], 0)`` with caching disabled.
        """
        if not self.enable_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        self._ensure_hashes(request, max_blocks)
        hit: list[int] = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hit.append(block.block_id)
        return hit, len(hit) * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_block_ids: Sequence[int] = (),
    ) -> list[int] | None:
        """Make room for a request's next tokens.

        Args:
            request: The request; its ``num_computed_tokens`` counts tokens already in its
                blocks (not including ``new_computed_block_ids``).
            num_new_tokens: Tokens to be computed this step, after the cached ones.
            new_computed_block_ids: Prefix-cache hits from :meth:`get_computed_blocks`;
                only at admission, when the request holds no blocks yet.

        Returns:
            The ids of newly allocated (uncomputed) blocks, possibly empty; ``None`` when
            not enough blocks are free, in which case nothing changed.
        """
        rid = request.request_id
        table = self._tables.get(rid)
        if (
            table is not None
            and not new_computed_block_ids
            and request.num_computed_tokens + num_new_tokens <= len(table) * self.block_size
        ):
            # The common decode step: the held blocks already have room (nothing below
            # would change anything); this early return keeps it O(1).
            return []
        admitting = table is None
        if new_computed_block_ids and not admitting:
            raise ValueError(f"request {rid!r} already holds blocks; cache hits are only for admission")
        hits = [self.pool.blocks[i] for i in new_computed_block_ids]
        if any(b.block_hash is None for b in hits):
            raise ValueError("a prefix-cache hit was evicted before allocate_slots; allocate right after lookup")
        num_held = 0 if table is None else len(table)
        num_tokens = request.num_computed_tokens + len(hits) * self.block_size + num_new_tokens
        num_needed = max(0, -(-num_tokens // self.block_size) - num_held - len(hits))
        # Hits sitting in the cached-free list stop being allocatable once we take them.
        num_hits_free = sum(b.ref_cnt == 0 for b in hits)
        if num_needed > self.pool.num_free_blocks - num_hits_free:
            return None

        if table is None:
            table = self._tables[rid] = []
            self._requests[rid] = request
            self._num_committed[rid] = len(hits)
            if self.enable_caching:
                self.prefix_cache_queries += request.num_tokens
                self.prefix_cache_hits += len(hits) * self.block_size
        self.pool.touch(hits)
        new_blocks = self.pool.allocate(num_needed)
        table.extend(hits)
        table.extend(new_blocks)
        new_ids = [b.block_id for b in new_blocks]
        request.block_ids.extend(new_computed_block_ids)
        request.block_ids.extend(new_ids)
        return new_ids

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register a request's newly completed full blocks in the prefix cache.

        Call after the step that computed them (the scheduler does so in
        ``update_from_output``).

        Args:
            request: A request holding blocks.
            num_computed_tokens: Leading tokens whose KV is now in the cache.
        """
        if not self.enable_caching:
            return
        rid = request.request_id
        table = self._tables.get(rid)
        if table is None:
            return
        num_full = min(num_computed_tokens // self.block_size, len(table))
        start = self._num_committed[rid]
        if num_full <= start:
            return
        self._ensure_hashes(request, num_full)
        for i in range(start, num_full):
            if table[i].block_hash is None:
                self.pool.cache_block(table[i], request.block_hashes[i])
        self._num_committed[rid] = num_full

    def free(self, request: Request) -> None:
        """Release every block of a request (finished, aborted or preempted).

        Full computed blocks stay in the prefix cache until evicted. Freeing a request
        that holds nothing is a no-op.

        Args:
            request: The request; its ``block_ids`` is cleared.
        """
        rid = request.request_id
        table = self._tables.pop(rid, None)
        self._requests.pop(rid, None)
        self._num_committed.pop(rid, None)
        request.block_ids.clear()
        if table:
            # Tail first: the tail is the least likely to be shared, so evict it first.
            self.pool.free(reversed(table))

    def reset_prefix_cache(self) -> bool:
        """Drop every prefix-cache entry (e.g. after weights changed).

        Blocks held by running requests stay allocated but will not be hit again.

        Returns:
            True (resetting is always possible here).
        """
        self.pool.reset_prefix_cache()
        self.check_invariants()
        return True

    def check_invariants(self) -> None:
        """Verify that every block is free, cached-free, or referenced, exactly as the
        block tables say, and that each request's ``block_ids`` mirrors its table.

        Raises:
            KVCacheInvariantError: Listing every violation found.
        """
        refs: Counter[int] = Counter()
        errors: list[str] = []
        for rid, table in self._tables.items():
            ids = [b.block_id for b in table]
            if len(set(ids)) != len(ids):
                errors.append(f"request {rid!r} holds a block twice: {ids}")
            if self._requests[rid].block_ids != ids:
                errors.append(f"request {rid!r}: block_ids {self._requests[rid].block_ids} != table {ids}")
            refs.update(ids)
        errors.extend(self.pool.invariant_errors(refs))
        if errors:
            raise KVCacheInvariantError("; ".join(errors))

    def _ensure_hashes(self, request: Request, num_blocks: int) -> None:
        extend_block_hashes(request.block_hashes, request.all_token_ids, num_blocks, self.block_size,
                            request.cache_salt, self.hash_algo)
