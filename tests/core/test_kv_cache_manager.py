"""KVCacheManager / BlockPool: allocation, prefix caching, LRU eviction, invariants."""

from __future__ import annotations

import pytest

from core_fakes import Params
from forkless.core.block_pool import HASH_ALGOS, hash_block_tokens
from forkless.core.kv_cache_manager import KVCacheInvariantError, KVCacheManager
from forkless.core.request import Request
from forkless.core.sched import KVCacheConfig

BS = 4


def make_kv(num_blocks: int = 8, **kw: object) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig(num_blocks=num_blocks, block_size=BS, **kw))  # type: ignore[arg-type]


def req(rid: str, tokens: list[int], salt: object = None) -> Request:
    return Request(rid, tokens, Params(), cache_salt=salt)


def run_prefill(kv: KVCacheManager, request: Request) -> tuple[list[int], int]:
    """Admit a request, 'compute' its whole prompt, and register its full blocks."""
    hits, num_cached = kv.get_computed_blocks(request)
    new = kv.allocate_slots(request, request.num_tokens - num_cached, hits)
    assert new is not None
    request.num_computed_tokens = request.num_tokens
    kv.cache_blocks(request, request.num_computed_tokens)
    kv.check_invariants()
    return hits, num_cached


def test_allocate_grows_table_and_none_when_full() -> None:
    kv = make_kv(num_blocks=3)
    r = req("a", list(range(5)))
    assert kv.allocate_slots(r, 5) == [0, 1]
    assert r.block_ids == [0, 1] == kv.get_block_ids("a")
    r.num_computed_tokens = 5
    assert kv.allocate_slots(r, 3) == []  # positions 5..7 still fit block 1
    r.num_computed_tokens = 8
    assert kv.allocate_slots(r, 1) == [2]
    r.num_computed_tokens = 9
    assert kv.num_free_blocks == 0 and kv.usage == 1.0
    assert kv.allocate_slots(r, 4) is None
    assert r.block_ids == [0, 1, 2]  # a failed allocation changes nothing
    kv.check_invariants()
    kv.free(r)
    assert r.block_ids == [] and kv.num_free_blocks == 3 and kv.usage == 0.0
    kv.check_invariants()


def test_prefix_hit_shares_blocks_and_counts() -> None:
    kv = make_kv()
    a = req("a", list(range(10)))  # blocks [0..3] [4..7] + partial
    assert run_prefill(kv, a) == ([], 0)
    b = req("b", list(range(8)) + [99, 98, 97])
    hits, num_cached = run_prefill(kv, b)
    assert hits == a.block_ids[:2] and num_cached == 8
    assert b.block_ids[:2] == a.block_ids[:2]
    assert kv.pool.blocks[a.block_ids[0]].ref_cnt == 2
    assert kv.prefix_cache_queries == 21 and kv.prefix_cache_hits == 8
    kv.free(a)
    assert kv.pool.blocks[b.block_ids[0]].ref_cnt == 1  # still b's
    kv.free(b)
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_blocks


def test_never_hits_the_whole_prompt() -> None:
    kv = make_kv()
    run_prefill(kv, req("a", list(range(8))))
    again = req("b", list(range(8)))  # exactly two full blocks, both cached
    hits, num_cached = kv.get_computed_blocks(again)
    assert num_cached == 4 and len(hits) == 1  # the last token must be recomputed
    longer = req("c", list(range(9)))
    assert kv.get_computed_blocks(longer)[1] == 8


def test_blocks_join_the_cache_only_once_computed() -> None:
    kv = make_kv()
    a = req("a", list(range(12)))
    assert kv.allocate_slots(a, 12) is not None  # scheduled, not computed yet
    assert kv.get_computed_blocks(req("b", list(range(12))))[1] == 0
    a.num_computed_tokens = 6
    kv.cache_blocks(a, 6)  # first chunk done: one full block
    assert kv.get_computed_blocks(req("c", list(range(12))))[1] == 4


def test_cache_salt_separates_prefixes() -> None:
    kv = make_kv()
    run_prefill(kv, req("a", list(range(9)), salt="lora-1"))
    assert kv.get_computed_blocks(req("b", list(range(9)), salt="lora-2"))[1] == 0
    assert kv.get_computed_blocks(req("c", list(range(9))))[1] == 0
    assert kv.get_computed_blocks(req("d", list(range(9)), salt="lora-1"))[1] == 8


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_hash_chain_depends_on_parent_and_extra_key(algo: str) -> None:
    h0 = hash_block_tokens(None, [1, 2], algo=algo)
    assert hash_block_tokens(h0, [3, 4], algo=algo) != hash_block_tokens(None, [3, 4], algo=algo)
    assert hash_block_tokens(None, [1, 2], "x", algo) != h0
    assert hash_block_tokens(None, [1, 2], algo=algo) == h0
    assert hash_block_tokens(None, [2, 1], algo=algo) != h0


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_sha256_digests(algo: str) -> None:
    digest = hash_block_tokens(None, [1, 2], algo=algo)
    assert isinstance(digest, bytes) and len(digest) == 32
    assert digest != hash_block_tokens(None, [1, 2], algo="sha256_cbor" if algo == "sha256" else "sha256")


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_prefix_caching_with_every_algo(algo: str) -> None:
    kv = make_kv(prefix_caching_hash_algo=algo)
    assert kv.hash_algo == algo
    run_prefill(kv, req("a", list(range(9)), salt="t"))
    assert kv.get_computed_blocks(req("b", list(range(9)), salt="t"))[1] == 8
    assert kv.get_computed_blocks(req("c", list(range(9)), salt="u"))[1] == 0


def test_freed_blocks_stay_cached_until_a_fresh_block_is_needed() -> None:
    kv = make_kv(num_blocks=6)
    a = req("a", list(range(9)))  # 2 full blocks (cached) + 1 partial
    run_prefill(kv, a)
    full = a.block_ids[:2]
    kv.free(a)
    assert kv.num_free_blocks == 6 and kv.usage == 0.0
    # 4 uncached blocks are free: using them evicts nothing.
    c = req("c", [100 + i for i in range(16)])
    assert kv.allocate_slots(c, 16) is not None
    assert not set(c.block_ids) & set(full)
    assert kv.get_computed_blocks(req("a2", list(range(9))))[1] == 8
    # The next fresh block must evict: the tail (block 2 of a) goes first.
    c.num_computed_tokens = 16
    assert kv.allocate_slots(c, 1) == [full[1]]
    assert kv.get_computed_blocks(req("a3", list(range(9))))[1] == 4
    c.num_computed_tokens = 17
    assert kv.allocate_slots(c, 4) == [full[0]]
    assert kv.get_computed_blocks(req("a4", list(range(9))))[1] == 0
    kv.check_invariants()


def test_eviction_is_least_recently_used() -> None:
    kv = make_kv(num_blocks=4)
    a, b = req("a", [1, 1, 1, 1, 0]), req("b", [2, 2, 2, 2, 0])
    run_prefill(kv, a)
    run_prefill(kv, b)
    block_a, block_b = a.block_ids[0], b.block_ids[0]
    kv.free(a)
    kv.free(b)  # b freed last: a's block is older
    # Hitting a's block again makes it the most recently used.
    a2 = req("a2", [1, 1, 1, 1, 7])
    run_prefill(kv, a2)
    assert a2.block_ids[0] == block_a
    kv.free(a2)
    fresh = req("x", [9] * 16)
    assert kv.allocate_slots(fresh, 12) is not None  # 2 uncached free + 1 eviction
    assert block_b in fresh.block_ids and block_a not in fresh.block_ids
    assert kv.get_computed_blocks(req("a3", [1, 1, 1, 1, 0]))[1] == 4
    assert kv.get_computed_blocks(req("b3", [2, 2, 2, 2, 0]))[1] == 0


def test_cached_free_hits_are_not_double_counted_as_free() -> None:
    kv = make_kv(num_blocks=3)
    a = req("a", [1] * 8 + [0])
    run_prefill(kv, a)
    kv.free(a)
    b = req("b", [1] * 8 + [0] * 6)  # hits 2 cached-free blocks, needs 2 more
    hits, n = kv.get_computed_blocks(b)
    assert n == 8 and kv.num_free_blocks == 3
    # 3 free blocks, but 2 of them are the hits themselves: only 1 is left for new ones.
    assert kv.allocate_slots(b, 6, hits) is None
    assert kv.allocate_slots(b, 4, hits) == [next(iter(set(range(3)) - set(hits)))]
    kv.check_invariants()


def test_identical_concurrent_prefills_do_not_leak() -> None:
    kv = make_kv()
    a, b = req("a", list(range(9))), req("b", list(range(9)))
    for r in (a, b):  # both admitted before either computed anything
        assert kv.allocate_slots(r, 9) is not None
    for r in (a, b):
        r.num_computed_tokens = 9
        kv.cache_blocks(r, 9)
    kv.check_invariants()
    assert kv.pool.num_cached_blocks == 2  # b's copies stay unhashed
    kv.free(a)
    kv.free(b)
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_blocks
    assert kv.get_computed_blocks(req("c", list(range(9))))[1] == 8


def test_prefix_caching_disabled() -> None:
    kv = make_kv(enable_prefix_caching=False)
    run_prefill(kv, req("a", list(range(9))))
    assert kv.get_computed_blocks(req("b", list(range(9)))) == ([], 0)
    assert kv.pool.num_cached_blocks == 0 and kv.prefix_cache_queries == 0


def test_reset_prefix_cache() -> None:
    kv = make_kv()
    a = req("a", list(range(9)))
    run_prefill(kv, a)
    run_prefill(kv, req("b", list(range(100, 109))))
    kv.free(a)
    assert kv.reset_prefix_cache()
    assert kv.pool.num_cached_blocks == 0
    assert kv.get_computed_blocks(req("c", list(range(9))))[1] == 0
    assert kv.num_free_blocks == kv.num_blocks - 3  # b still holds its blocks


def test_cache_hits_only_at_admission() -> None:
    kv = make_kv()
    run_prefill(kv, req("a", list(range(9))))
    b = req("b", list(range(9)))
    hits, _ = kv.get_computed_blocks(b)
    assert kv.allocate_slots(b, 1, hits) is not None
    with pytest.raises(ValueError, match="admission"):
        kv.allocate_slots(b, 1, hits)


def test_invariant_check_catches_corruption() -> None:
    kv = make_kv()
    a = req("a", list(range(9)))
    run_prefill(kv, a)
    kv.pool.blocks[a.block_ids[0]].ref_cnt += 1
    with pytest.raises(KVCacheInvariantError, match="ref_cnt"):
        kv.check_invariants()
    kv.pool.blocks[a.block_ids[0]].ref_cnt -= 1
    a.block_ids.append(7)
    with pytest.raises(KVCacheInvariantError, match="block_ids"):
        kv.check_invariants()


def test_bad_kv_config() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheConfig(num_blocks=0)
    with pytest.raises(ValueError, match="sha256, sha256_cbor, builtin"):
        KVCacheConfig(num_blocks=4, prefix_caching_hash_algo="md5")
