"""The pool of fixed-size KV-cache blocks, with the prefix-cache index over them.

Every block is in exactly one of three places:

* **free** — never hashed (or its hash was dropped); handed out first;
* **cached-free** — refcount 0 but still holding a full, hashed block that a later
  request may hit; evicted least-recently-freed first, only when no free block is left;
* **referenced** — in the block table of at least one request (refcount > 0).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from typing import Hashable, Iterable, Sequence

# An opaque prefix-cache key: 32 bytes for the sha256 algorithms, an int for "builtin".
BlockHash = Hashable

# The choices of --prefix-caching-hash-algo, the default first. vLLM's xxhash and
# xxhash_cbor are missing: they need the optional xxhash package, which forkless does
# not depend on; "builtin" is the fast choice instead.
HASH_ALGOS = ("sha256", "sha256_cbor", "builtin")

# The parent of every sequence's first block: a constant, so that the sha256 hashes are
# the same in every process and every run (vLLM seeds its own from PYTHONHASHSEED or at
# random). A first block would share a hash with a later one only if some block's digest
# were this one: a SHA-256 preimage.
ROOT_HASH = hashlib.sha256(b"forkless prefix cache, root block").digest()


def hash_block_tokens(
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_key: Hashable | None = None,
    algo: str = "sha256",
) -> BlockHash:
    """Hash one full block, chained to the hash of the block before it.

    Chaining makes a block's hash identify the whole prefix up to and including it, so a
    lookup can stop at the first miss. Two blocks share KV only if their hashes are equal:
    with a collision one request would read another's KV (another tenant's prompt), so
    the default is collision-resistant.

    Args:
        parent_hash: Hash of the previous block of the sequence, ``None`` for the first.
        token_ids: The block's tokens (exactly ``block_size`` of them).
        extra_key: Anything else the KV depends on (LoRA adapter, cache salt): ``None``,
            a bool, int, str or bytes, or a tuple or list of those.
        algo: ``"sha256"``: SHA-256 over a canonical byte encoding (below), 32 bytes, the
            same in every process. ``"sha256_cbor"``: SHA-256 over canonical CBOR
            (RFC 8949, section 4.2.1) of ``[parent, tokens, extra_key]``, for hashes that
            other languages can reproduce (pure Python here: ~3x slower than
            ``"sha256"``). ``"builtin"``: Python's ``hash`` of a tuple, ~4x faster than
            ``"sha256"`` but 64 bits and not collision-resistant (colliding prompts can be
            constructed), and randomized per process for ``str`` keys: only for trusted,
            single-tenant traffic. For an 8k-token prompt in 16-token blocks: ~2 ms,
            ~7 ms and ~0.5 ms on a 2-core CPU.

    Returns:
        The block's hash.

    Raises:
        TypeError: ``extra_key`` holds something other than the types above (sha256
            algorithms only: their encodings must be canonical).
    """
    if algo == "sha256":
        # parent (32 bytes) | number of tokens (8 bytes) | tokens (8 bytes each) |
        # tagged extra key: every field has a fixed length or a length prefix, so two
        # different inputs never encode to the same bytes.
        h = hashlib.sha256(ROOT_HASH if parent_hash is None else parent_hash)
        h.update(len(token_ids).to_bytes(8, "little"))
        h.update(array("q", token_ids))
        if extra_key is None:
            h.update(b"N")  # what _encode_key writes for None, without its call
        else:
            key = bytearray()
            _encode_key(extra_key, key)
            h.update(key)
        return h.digest()
    if algo == "sha256_cbor":
        data = bytearray()
        _cbor([ROOT_HASH if parent_hash is None else parent_hash, list(token_ids), extra_key], data)
        return hashlib.sha256(data).digest()
    if algo == "builtin":
        return hash((parent_hash, tuple(token_ids), extra_key))
    raise ValueError(f"unknown prefix-cache hash algorithm {algo!r}; choose one of {', '.join(HASH_ALGOS)}")


def extend_block_hashes(hashes: list[BlockHash], token_ids: Sequence[int], num_blocks: int, block_size: int,
                        extra_key: Hashable | None = None, algo: str = "sha256") -> list[BlockHash]:
    """Extend a sequence's chain of full-block hashes to ``num_blocks`` (in place).

    Args:
        hashes: The hashes of the sequence's first blocks so far (a request's
            ``block_hashes``); never recomputed, since a full block never changes.
        token_ids: The sequence's tokens (at least ``num_blocks * block_size``).
        num_blocks: How many leading full blocks must be hashed.
        block_size: Tokens per block.
        extra_key: As for :func:`hash_block_tokens`.
        algo: As for :func:`hash_block_tokens`.

    Returns:
        ``hashes``.
    """
    parent = hashes[-1] if hashes else None
    for i in range(len(hashes), num_blocks):
        parent = hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size], extra_key, algo)
        hashes.append(parent)
    return hashes


def _encode_key(value: object, out: bytearray) -> None:
    """Append a self-delimiting, type-tagged encoding of an extra key to ``out``."""
    if value is None:
        out += b"N"
    elif value is True or value is False:
        out += b"T" if value else b"F"
    elif isinstance(value, int):
        raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        out += b"i" + len(raw).to_bytes(8, "little") + raw
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        out += b"s" + len(raw).to_bytes(8, "little") + raw
    elif isinstance(value, (bytes, bytearray)):
        out += b"b" + len(value).to_bytes(8, "little") + value
    elif isinstance(value, (tuple, list)):
        out += b"t" + len(value).to_bytes(8, "little")
        for item in value:
            _encode_key(item, out)
    else:
        raise TypeError(f"a prefix-cache extra key cannot hold {type(value).__name__} ({value!r})")


def _cbor_head(major: int, n: int, out: bytearray) -> None:
    # Canonical CBOR: the shortest form of every length and integer.
    if n < 24:
        out.append(major << 5 | n)
    elif n < 1 << 8:
        out += bytes((major << 5 | 24, n))
    elif n < 1 << 16:
        out.append(major << 5 | 25)
        out += n.to_bytes(2, "big")
    elif n < 1 << 32:
        out.append(major << 5 | 26)
        out += n.to_bytes(4, "big")
    else:
        out.append(major << 5 | 27)
        out += n.to_bytes(8, "big")


def _cbor(value: object, out: bytearray) -> None:
    """Append the canonical CBOR encoding of ``value`` to ``out`` (the types of
    :func:`_encode_key`; tuples and lists are both arrays, as ``cbor2`` encodes them)."""
    if value is None:
        out.append(0xF6)
    elif value is True or value is False:
        out.append(0xF5 if value else 0xF4)
    elif isinstance(value, int):
        major, n = (0, value) if value >= 0 else (1, -1 - value)
        if n < 1 << 64:
            _cbor_head(major, n, out)
        else:  # a bignum: tag 2 (or 3 for negative) over the big-endian magnitude
            raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
            _cbor_head(6, 2 + major, out)
            _cbor_head(2, len(raw), out)
            out += raw
    elif isinstance(value, (bytes, bytearray)):
        _cbor_head(2, len(value), out)
        out += value
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        _cbor_head(3, len(raw), out)
        out += raw
    elif isinstance(value, (tuple, list)):
        _cbor_head(4, len(value), out)
        for item in value:
            _cbor(item, out)
    else:
        raise TypeError(f"a prefix-cache extra key cannot hold {type(value).__name__} ({value!r})")


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
