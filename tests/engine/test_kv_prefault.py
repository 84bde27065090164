"""The CPU KV cache's pages are populated in the background without touching what steps
write (forkless/worker/kv_prefault.py)."""

from __future__ import annotations

import logging

import numpy as np
import torch

from forkless.worker.kv_prefault import _ranges, prefault_in_background


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_prefault_populates_the_cache_and_keeps_what_steps_wrote(caplog):
    # A cache as the CPU worker allocates it: calloc'd, [2 (keys, values), slots, heads, dim].
    nbytes = 2 * 8192 * 4 * 128 * 4  # 32 MiB
    cache = torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(torch.float32).view(2, 8192, 4, 128)
    cache[0, 5] = 1.5  # a step's write before the thread runs ...
    before = _rss_bytes()
    with caplog.at_level(logging.DEBUG, logger="forkless.worker.kv_prefault"):
        thread = prefault_in_background([cache])
        cache[1, 8000] = -2.0  # ... and one while it may be running
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert torch.all(cache[0, 5] == 1.5) and torch.all(cache[1, 8000] == -2.0)
    cache[0, 5] = 0.0
    cache[1, 8000] = 0.0
    assert not cache.any()  # nothing else was written
    if "failed" in caplog.text:  # a kernel without MADV_POPULATE_WRITE: the steps fault pages in
        assert "MADV_POPULATE_WRITE" in caplog.text
    else:
        assert "KV cache prefault: 0.03 GiB" in caplog.text
        assert _rss_bytes() - before > 0.9 * nbytes - 2 * 4096 * 8  # every page is now mapped


def test_ranges_split_key_and_value_halves_and_align_to_pages():
    cache = torch.zeros(2, 4000, 3)  # 48,000 bytes a half: not a page multiple
    (k0, k1), (v0, v1) = _ranges([cache])
    assert k0 % 4096 == 0 and k1 % 4096 == 0 and v0 % 4096 == 0 and v1 % 4096 == 0
    assert cache[0].data_ptr() <= k0 < k1 <= cache[1].data_ptr() <= v0 < v1
    assert len(_ranges([torch.zeros(3, 5000)])) == 1  # no key/value pair first: one range
