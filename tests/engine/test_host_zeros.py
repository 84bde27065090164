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
