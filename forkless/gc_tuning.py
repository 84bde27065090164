"""Garbage-collector settings of forkless's long-lived processes.

Python's cyclic collector runs a young collection every 700 allocations and, now and
then, a full one that walks every tracked object. A built engine holds some 200,000 of
them (the model's modules, the tokenizer's tables, imported code), and a full collection
of those stalls the step loop for a fifth of a second on a small CPU (benchmarks/README.md,
"Host overhead and garbage collection"): a stall that lands in some step at random. A
serving process also allocates a few objects per request per step (plans, token lists,
outputs), so at a few hundred requests it runs young collections many times a second.

Invariants:
    * Only processes that forkless owns from start to end are tuned for good: the API
      server, the engine core process and the worker processes, once they are built.
      Never a user's process (an offline ``LLM`` lives in one): there, freezing for good
      would keep any cycle of objects alive at that moment -- say an earlier ``LLM`` the
      user drops later -- from ever being collected.
    * In a user's process the collector is tuned only while an offline run steps the
      engine (:func:`paused_full_collections`) and put back as it was when the run ends:
      what was frozen for the run is unfrozen, so a cycle dropped meanwhile is collected
      by the next full collection after the run, as it would have been without it.
    * Freezing (``gc.freeze``) only moves what exists into the permanent generation:
      reference counting frees objects as before, and what a tuned process builds later
      is collected as usual.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

#: Allocations between young collections in forkless's own processes (Python's default: 700).
YOUNG_THRESHOLD = 50_000


def tune_process() -> None:
    """Collect once, move every surviving object out of the collector's generations, and
    run young collections every ``YOUNG_THRESHOLD`` allocations (see the invariants)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 10, 10)


@contextlib.contextmanager
def paused_full_collections() -> Iterator[None]:
    """While an offline run steps the engine: freeze what exists and collect the young
    generation every ``YOUNG_THRESHOLD`` allocations; afterwards, unfreeze and restore
    the thresholds (see the invariants).

    A full collection during the run walks the whole built engine: on the H200's host
    (benchmarks/README.md) eleven of them, 50-230 ms each with ~360,000 objects in the
    oldest generation, stalled a 12 s throughput run for ~1.7 s. Objects the run creates
    are still collected as usual. Nested or concurrent runs (threads) share one pause,
    which ends with the last of them. Objects that something else froze before the run
    (``gc.freeze``) are unfrozen with the rest when it ends -- Python cannot unfreeze a
    part -- which only means the collector examines them again, as it does by default.
    """
    global _paused_runs, _paused_state
    with _pause_lock:
        _paused_runs += 1
        if _paused_runs == 1:
            _paused_state = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(YOUNG_THRESHOLD, *_paused_state[1:])
    try:
        yield
    finally:
        with _pause_lock:
            _paused_runs -= 1
            if _paused_runs == 0 and _paused_state is not None:
                gc.set_threshold(*_paused_state)
                gc.unfreeze()
                _paused_state = None


_pause_lock = threading.Lock()
_paused_runs = 0
# The thresholds to restore when the last run ends (None while no run is paused).
_paused_state: tuple[int, ...] | None = None


__all__ = ["YOUNG_THRESHOLD", "paused_full_collections", "tune_process"]
