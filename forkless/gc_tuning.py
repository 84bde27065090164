"""Garbage-collector settings of forkless's long-lived processes.

Python's cyclic collector runs a young collection every 700 allocations and, now and
then, a full one that walks every tracked object. A built engine holds some 200,000 of
them (the model's modules, the tokenizer's tables, imported code), and a full collection
of those stalls the step loop for a fifth of a second on a small CPU (benchmarks/README.md,
"Host overhead and garbage collection"): a stall that lands in some step at random. A
serving process also allocates a few objects per request per step (plans, token lists,
outputs), so at a few hundred requests it runs young collections many times a second.

Invariants:
    * Only processes that forkless owns from start to end are tuned: the API server, the
      engine core process and the worker processes, once they are built. Never a user's
      process (an offline ``LLM`` lives in one): there, freezing would keep any cycle of
      objects alive at that moment -- say an earlier ``LLM`` the user drops later --
      from ever being collected.
    * Freezing (``gc.freeze``) only moves what exists into the permanent generation:
      reference counting frees objects as before, and what a tuned process builds later
      is collected as usual.
"""

from __future__ import annotations

import gc

#: Allocations between young collections in forkless's own processes (Python's default: 700).
YOUNG_THRESHOLD = 50_000


def tune_process() -> None:
    """Collect once, move every surviving object out of the collector's generations, and
    run young collections every ``YOUNG_THRESHOLD`` allocations (see the invariants)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 10, 10)


__all__ = ["YOUNG_THRESHOLD", "tune_process"]
