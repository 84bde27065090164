"""The CPU KV cache's storage: zeros, committed page by page, in small pages."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from forkless.worker.host_zeros import lazy_zeros


def _vm_flags(address: int) -> list[str]:
    """The kernel's VmFlags of the mapping that holds ``address`` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_lazy_zeros_reads_as_zeros_and_takes_writes() -> None:
    a = lazy_zeros(3 << 20)
    assert a.dtype == np.uint8 and a.shape == (3 << 20,) and not a.any()
    a[12345] = 7
    assert a.sum() == 7
    assert lazy_zeros(10).tolist() == [0] * 10  # too small to advise: still zeros


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/smaps are Linux's")
def test_the_cache_asks_for_small_pages() -> None:
    # numpy asks for huge pages ("hg"); a huge-page fault may stall a step compacting memory.
    a = lazy_zeros(64 << 20)
    flags = _vm_flags(a.ctypes.data + (32 << 20))
    assert "nh" in flags and "hg" not in flags, flags


def _resident(address: int, length: int) -> np.ndarray:
    """Whether each 4 KiB page of ``[address, address + length)`` is mapped in (mincore)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    start = address // 4096 * 4096
    pages = -(-(address + length - start) // 4096)
    out = ctypes.create_string_buffer(pages)
    assert libc.mincore(start, address + length - start, out) == 0, ctypes.get_errno()
    return np.frombuffer(out.raw, dtype=np.uint8) & 1 == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and mincore are Linux's")
def test_a_blocks_pages_are_mapped_in_before_its_first_write() -> None:
    """The runner's BlockPopulator maps in exactly the blocks it is given (keys and values
    of every layer), once; the rest of the cache stays unmapped and everything reads as
    zeros."""
    import torch

    from forkless.worker.host_zeros import BlockPopulator

    import mmap

    # 64 KiB of float32 keys (and values) a block. The caches are fresh anonymous mappings,
    # page-aligned and never touched: lazy_zeros' calloc may be served from malloc's heap,
    # already touched, once a process has freed enough (as a long test session has).
    num_blocks, block = 512, (16, 8, 128)
    nbytes = 2 * num_blocks * 65536
    mappings = [mmap.mmap(-1, nbytes) for _ in range(3)]
    caches = [torch.from_numpy(np.frombuffer(m, dtype=np.uint8)).view(torch.float32).view(2, num_blocks, *block)
              for m in mappings]
    populator = BlockPopulator(caches, num_blocks)
    if not populator.active:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    populator.populate([5, 6, 7, 300, 6])
    for cache in caches:
        for half in cache:  # keys, values
            mapped = _resident(half.data_ptr(), half.numel() * 4).reshape(num_blocks, 16)
            assert np.flatnonzero(mapped.all(axis=1)).tolist() == [5, 6, 7, 300]
            assert np.flatnonzero(mapped.any(axis=1)).tolist() == [5, 6, 7, 300]
        assert not cache.any()
    caches[0][1, 300] = 1.0  # writable as before
    assert caches[0].sum() == 16 * 8 * 128
    populator.populate([6, 300])  # already mapped: nothing to do
    assert BlockPopulator([caches[0].transpose(0, 1)], num_blocks).active is False  # not contiguous
