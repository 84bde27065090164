"""Prefix-cache block hashes are collision-safe across tenants.

A block's KV is shared exactly when two requests' block hashes are equal, so a collision
lets one tenant read (or poison) another's KV. The default, ``sha256``, hashes a canonical
byte encoding of (parent hash, token ids, extra key such as ``cache_salt``): different
inputs never encode to the same bytes, and the digest is the same in every process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core_fakes import Params, Result, assert_no_leaks, make_scheduler, run_all, step
from forkless.core.block_pool import HASH_ALGOS, _cbor, hash_block_tokens
from forkless.core.request import Request
from forkless.core.sched import KVCacheConfig

REPO = Path(__file__).resolve().parents[2]


def test_default_is_sha256() -> None:
    assert HASH_ALGOS[0] == "sha256"
    assert KVCacheConfig(num_blocks=4).prefix_caching_hash_algo == "sha256"
    s, _ = make_scheduler()
    assert s.kv_cache_manager.hash_algo == "sha256"


def salted(rid: str, tokens: list[int], salt: object) -> Request:
    return Request(rid, tokens, Params(max_tokens=2), eos_token_id=2, cache_salt=salt)


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_different_cache_salts_never_share_blocks(algo: str) -> None:
    s, runner = make_scheduler(block_size=4)
    s.kv_cache_manager.hash_algo = algo
    prompt = list(range(100, 121))  # five full blocks and one token
    results: dict[str, Result] = {}
    s.add_request(salted("a", prompt, "tenant-a"))
    step(s, runner, results)
    blocks_a = set(s.requests["a"].block_ids)
    # Same prompt, other tenant, while a still holds its (now cached) blocks.
    s.add_request(salted("b", prompt, "tenant-b"))
    (item,) = [i for i in step(s, runner, results).scheduled_requests if i.request_id == "b"]
    assert item.start_position == 0 and not blocks_a & set(item.new_block_ids)
    # Same tenant again: it does share a's blocks.
    s.add_request(salted("c", prompt, "tenant-a"))
    (item,) = [i for i in step(s, runner, results).scheduled_requests if i.request_id == "c"]
    assert item.start_position == 20 and set(item.new_block_ids[:5]) <= blocks_a
    run_all(s, runner, results)
    assert (results["a"].num_cached_tokens, results["b"].num_cached_tokens, results["c"].num_cached_tokens) == (0, 0, 20)
    # And a request without a salt shares with neither.
    s.add_request(salted("d", prompt, None))
    assert run_all(s, runner)["d"].num_cached_tokens == 0
    assert_no_leaks(s)


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_extra_keys_are_encoded_without_ambiguity(algo: str) -> None:
    keys = [None, True, False, 0, 1, -1, 2**70, "1", "", b"1", b"", ("a", "b"), ("ab",), ("a", ("b",)),
            (1, "x"), ("x", 1), ()]
    digests = {hash_block_tokens(None, [5, 6], key, algo) for key in keys}
    assert len(digests) == len(keys)
    # Token boundaries matter too: [1, 23] is not [12, 3].
    assert hash_block_tokens(None, [1, 23], None, algo) != hash_block_tokens(None, [12, 3], None, algo)
    with pytest.raises(TypeError, match="float"):
        hash_block_tokens(None, [1], 1.5, algo)


def test_canonical_cbor_matches_rfc8949() -> None:
    # Appendix A of RFC 8949, in the shortest (canonical) forms.
    cases = [(0, "00"), (23, "17"), (24, "1818"), (100, "1864"), (1000, "1903e8"), (1000000, "1a000f4240"),
             (2**32, "1b0000000100000000"), (2**64, "c249010000000000000000"),
             (-(2**64) - 1, "c349010000000000000000"), (-1, "20"), (-1000, "3903e7"), (b"", "40"), (b"\x01\x02", "420102"),
             ("", "60"), ("a", "6161"), ("\u00fc", "62c3bc"), ([], "80"), ([1, [2, 3]], "8201820203"),
             ((1, 2), "820102"), (None, "f6"), (True, "f5"), (False, "f4")]
    for value, expected in cases:
        out = bytearray()
        _cbor(value, out)
        assert out.hex() == expected, value


HASH_SCRIPT = """
import sys
from forkless.core.block_pool import hash_block_tokens
algo = sys.argv[1]
parent = None
for i in range(4):
    parent = hash_block_tokens(parent, list(range(16 * i, 16 * i + 16)), ("tenant", 7), algo)
print(parent.hex() if isinstance(parent, bytes) else parent)
"""


def hash_in_subprocess(algo: str, hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", HASH_SCRIPT, algo], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout.strip()


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_sha256_hashes_are_the_same_in_every_process(algo: str) -> None:
    first, second = hash_in_subprocess(algo, "1"), hash_in_subprocess(algo, "2")
    assert first == second and len(first) == 64
    assert bytes.fromhex(first) == _chain_here(algo)


def test_builtin_hashes_change_with_the_process() -> None:
    # Why it is not the default: Python randomizes str hashing per process.
    assert hash_in_subprocess("builtin", "1") != hash_in_subprocess("builtin", "2")


def _chain_here(algo: str) -> bytes:
    parent = None
    for i in range(4):
        parent = hash_block_tokens(parent, list(range(16 * i, 16 * i + 16)), ("tenant", 7), algo)
    assert isinstance(parent, bytes)
    return parent


def test_hashing_an_8k_token_prompt_takes_milliseconds() -> None:
    tokens = [(i * 7919) % 49152 for i in range(8192)]
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        parent = None
        for i in range(0, 8192, 16):
            parent = hash_block_tokens(parent, tokens[i : i + 16], "tenant", "sha256")
        best = min(best, time.perf_counter() - start)
    # ~2-3 ms on a 2-core sandbox; the bound leaves room for a loaded machine.
    assert best < 0.05
