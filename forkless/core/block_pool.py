"""The pool of fixed-size KV-cache blocks, with the prefix-cache index over them.

Every block is in exactly one of three places:

* **free** — never hashed (or its hash was dropped); handed out first;
* **cached-free** — refcount 0 but still holding a full, hashed block that a later
  request may hit; evicted least-recently-freed first, only when no free block is left;
* **referenced** — in the block table of at least one request (refcount > 0).
"""

from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict, deque
from typing import Hashable, Iterable, Sequence

# An opaque prefix-cache key: an int for "builtin", 32 bytes for "sha256".
BlockHash = Hashable

HASH_ALGOS = ("builtin", "sha256")


def hash_block_tokens(
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_key: Hashable | None = None,
    algo: str = "builtin",
) -> BlockHash:
    """Hash one full block, chained to the hash of the block before it.

    Chaining makes a block's hash identify the whole prefix up to and including it, so a
    lookup can stop at the first miss.

    Args:
        parent_hash: Hash of the previous block of the sequence, ``None`` for the first.
        token_ids: The block's tokens (exactly ``block_size`` of them).
        extra_key: Anything else the KV depends on (LoRA adapter, cache salt).
        algo: ``"builtin"`` (Python's ``hash``: fast, 64-bit, per-process for str keys)
            or ``"sha256"`` (collision-resistant, for untrusted multi-tenant prompts).

    Returns:
        The block's hash.
    """
    key = (parent_hash, tuple(token_ids), extra_key)
    if algo == "builtin":
        return hash(key)
    # pickle is only a canonical byte encoding here; nothing is ever unpickled.
    return hashlib.sha256(pickle.dumps(key, protocol=5)).digest()


class KVCacheBlock:
    """Metadata of one KV-cache block (the tensor memory lives in the model runner).

    Attributes:
        block_id: Index of the block in the runner's KV-cache tensors.
        ref_cnt: Number of request block tables that contain it.
        block_hash: Its prefix-cache hash once it is full and registered, else ``None``.
    """

    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}, hashed={self.block_hash is not None})"


class BlockPool:
    """Hands out blocks, takes them back, and indexes the cached ones by hash.

    Args:
        num_blocks: Total number of blocks.
    """

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self._free: deque[KVCacheBlock] = deque(self.blocks)
        # Insertion order is eviction order: the least recently freed block comes first.
        self._cached_free: OrderedDict[int, KVCacheBlock] = OrderedDict()
        self._by_hash: dict[BlockHash, KVCacheBlock] = {}

    @property
    def num_blocks(self) -> int:
        """Total number of blocks."""
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that :meth:`allocate` can hand out (free plus cached-free)."""
        return len(self._free) + len(self._cached_free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix-cache index (referenced or not)."""
        return len(self._by_hash)

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """The block registered under ``block_hash``, if any."""
        return self._by_hash.get(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on cache-hit blocks, rescuing cached-free ones from eviction."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._cached_free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, num_blocks: int) -> list[KVCacheBlock]:
        """Hand out fresh blocks, each with one reference.

        Args:
            num_blocks: How many.

        Returns:
            The blocks; never-hashed ones first, then evicted cached ones (LRU).

        Raises:
            ValueError: Fewer than ``num_blocks`` are free; callers check first.
        """
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot allocate {num_blocks} blocks, {self.num_free_blocks} free")
        out: list[KVCacheBlock] = []
        for _ in range(num_blocks):
            if self._free:
                block = self._free.popleft()
            else:
                _, block = self._cached_free.popitem(last=False)
                del self._by_hash[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def free(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block.

        Args:
            blocks: In the order they should become evictable: the first one freed is
                the first one evicted. Callers pass a request's table tail-first so that
                shared prefixes outlive the unique tails.
        """
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is not None:
                    self._cached_free[block.block_id] = block
                else:
                    self._free.append(block)

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash) -> bool:
        """Register a full, computed block in the prefix-cache index.

        Args:
            block: A referenced block without a hash.
            block_hash: Its chained hash.

        Returns:
            False when another block already holds the same content (two requests computed
            the same prefix at once); this one then stays unhashed and is freed normally.
        """
        if block_hash in self._by_hash:
            return False
        block.block_hash = block_hash
        self._by_hash[block_hash] = block
        return True

    def reset_prefix_cache(self) -> None:
        """Forget every hash; cached-free blocks become plain free blocks."""
        for block in self._by_hash.values():
            block.block_hash = None
        self._free.extend(self._cached_free.values())
        self._cached_free.clear()
        self._by_hash.clear()

    def invariant_errors(self, expected_refs: dict[int, int]) -> list[str]:
        """Compare the pool's bookkeeping with the references the block tables hold.

        Args:
            expected_refs: block id -> number of block tables containing it.

        Returns:
            One message per violation; empty when consistent.
        """
        errors: list[str] = []
        free_ids = [b.block_id for b in self._free]
        free_set = set(free_ids)
        if len(free_set) != len(free_ids):
            errors.append("a block is in the free queue twice")
        for block in self.blocks:
            bid = block.block_id
            in_free = bid in free_set
            in_cached_free = bid in self._cached_free
            if block.ref_cnt != expected_refs.get(bid, 0):
                errors.append(
                    f"block {bid}: ref_cnt {block.ref_cnt} but in "
                    f"{expected_refs.get(bid, 0)} block tables"
                )
            if block.ref_cnt < 0:
                errors.append(f"block {bid}: negative ref_cnt")
            if block.ref_cnt > 0 and (in_free or in_cached_free):
                errors.append(f"block {bid}: referenced but also free")
            if block.ref_cnt == 0 and in_free == in_cached_free:
                errors.append(f"block {bid}: unreferenced but in {'both' if in_free else 'no'} free list(s)")
            if in_free and block.block_hash is not None:
                errors.append(f"block {bid}: hashed but in the uncached free queue")
            if in_cached_free and block.block_hash is None:
                errors.append(f"block {bid}: cached-free without a hash")
            if block.block_hash is not None and self._by_hash.get(block.block_hash) is not block:
                errors.append(f"block {bid}: hash not indexed to it")
        if sum(b.block_hash is not None for b in self.blocks) != len(self._by_hash):
            errors.append("prefix-cache index holds blocks that lost their hash")
        return errors
