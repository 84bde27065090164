"""Fault a CPU KV cache's pages in off the step loop.

A CPU worker allocates its KV cache untouched (calloc'd: the OS maps a page only when it is
first written), so a multi-GiB cache costs nothing at start. Left at that, every first
write of a page faults inside a step, in the KV store: on a 2-core Xeon the default model's
offline throughput workload spent 1.3-1.9 s of its 27 s there, and 0.25 s with the cache
written once before. vLLM pays this at start, zeroing its whole cache. Here a daemon thread
asks the kernel to populate the cache's pages while the engine starts and runs.

Invariants:

* The thread never writes the cache: ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14+) maps
  zero-filled pages and leaves a page already written alone, so steps may write the cache
  while it runs.
* The lowest addresses of every cache tensor go first, tensor by tensor in chunks, so the
  blocks the pool hands out first (the lowest ids) are ready first; a tensor whose first
  dimension is the key/value pair is taken as its two halves.
* The calls go through ctypes, which releases the GIL: the engine's threads run meanwhile.
* Where the call is unsupported (another OS, an older kernel), the thread stops after its
  first try and the steps fault the pages in as before (logged at debug level).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time

import torch

from forkless.logger import init_logger

logger = init_logger(__name__)

#: Linux's MADV_POPULATE_WRITE (asm-generic/mman-common.h; Python's mmap module lacks it
#: before 3.13).
_MADV_POPULATE_WRITE = 23
_PAGE = 4096
#: Bytes of one tensor populated per call before moving to the next tensor.
_CHUNK = 16 << 20


def _ranges(caches: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Page-aligned ``(start, end)`` address ranges covering the caches' memory."""
    out = []
    for cache in caches:
        parts = list(cache) if cache.dim() > 1 and cache.shape[0] == 2 else [cache]
        for part in parts:
            start = part.data_ptr()
            end = start + part.numel() * part.element_size()
            start = -(-start // _PAGE) * _PAGE
            end = end // _PAGE * _PAGE
            if end > start:
                out.append((start, end))
    return out


def _populate(caches: list[torch.Tensor]) -> None:
    started = time.perf_counter()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError, TypeError) as exc:
        logger.debug("KV cache prefault: no madvise (%s); pages fault in as steps write them", exc)
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    ranges = _ranges(caches)
    total = sum(end - start for start, end in ranges)
    offset = 0
    while any(start + offset < end for start, end in ranges):
        for start, end in ranges:
            if start + offset < end and madvise(start + offset, min(_CHUNK, end - start - offset),
                                                _MADV_POPULATE_WRITE) != 0:
                logger.debug("KV cache prefault: madvise(MADV_POPULATE_WRITE) failed (errno %d); pages fault "
                             "in as steps write them", ctypes.get_errno())
                return
        offset += _CHUNK
    logger.debug("KV cache prefault: %.2f GiB in %.2f s", total / (1 << 30), time.perf_counter() - started)


def prefault_in_background(caches: list[torch.Tensor]) -> threading.Thread:
    """Start the daemon thread that populates ``caches``' pages (see the module's
    invariants); it holds the tensors until it is done.

    Returns:
        The started thread.
    """
    thread = threading.Thread(target=_populate, args=(list(caches),), name="forkless-kv-prefault", daemon=True)
    thread.start()
    return thread
