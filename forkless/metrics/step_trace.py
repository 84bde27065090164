"""Per-step timing records of the step loop, to find where a step's time goes.

Set ``FORKLESS_STEP_TRACE_DIR`` and, with ``--async-scheduling``, the engine core and
every multiprocess worker (``--distributed-executor-backend mp``) append one JSON object
per step to ``<dir>/steps-<role>-<pid>.jsonl`` (role ``core``, ``worker<rank>``, or
``grammar`` for the grammar process: one record per deferred bitmask fill);
``python -m forkless.metrics.step_trace DIR`` summarises them, and ``... DIR --timeline N``
lays out N steps' events of every process in time order. A core record says when the
step began, was scheduled and launched, how long the core waited for the workers' results
and applied them (and, with structured outputs under async scheduling, how long it
waited for a deferred step's bitmask); a worker record says when the worker received the step, decoded its
message, launched it, (for a deferred step) took its ``sample`` message, began waiting for
its results, had them and sent them; a grammar record, when the process took a fill, had
written the bitmask and had told the workers to sample. On CUDA the
worker also brackets each launched step with
timing events, so ``gpu_ms`` is the step's own time on the device and ``gpu_idle_ms`` the
gap between the previous step's end and this one's start: time the device sat idle
waiting for the host.

Invariants:
    * Off unless the variable is set: :meth:`StepTrace.open` then returns ``None`` and the
      step loop pays one ``is None`` test per step.
    * Times are ``time.monotonic()`` seconds, one clock for every process of a machine,
      so records of several processes line up.
    * Records are appended 64 at a time and at :meth:`StepTrace.close`: a killed process
      loses at most its last 63.
    * Device events are read only after their step was collected (its results waited
      for); the one extra wait, for the event queued right after the step's last work,
      lasts microseconds: tracing does not change the step loop's overlap.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from forkless.tracing import StepTrace

__all__ = ["CudaStepTimer", "StepTrace", "main", "summarize"]


class CudaStepTimer:
    """Timing events around each launched step on the current CUDA stream.

    ``start(seq)`` before a step's launch and ``end(seq)`` after it queue the events;
    ``read(seq)``, once the step's results were waited for, gives the step's device time
    and the idle gap since the previous step's end (``None`` for the first step).
    """

    def __init__(self) -> None:
        import torch

        self._event = lambda: torch.cuda.Event(enable_timing=True)
        self._marks: dict[int, tuple[Any, Any]] = {}
        self._last_end: Any = None

    def drop(self, seq: int) -> None:
        """Forget a step that was never collected (its launch failed)."""
        self._marks.pop(seq, None)

    def start(self, seq: int) -> None:
        ev = self._event()
        ev.record()
        self._marks[seq] = (ev, None)

    def end(self, seq: int) -> None:
        ev = self._event()
        ev.record()
        self._marks[seq] = (self._marks[seq][0], ev)

    def read(self, seq: int) -> tuple[float | None, float | None]:
        marks = self._marks.pop(seq, None)
        if marks is None or marks[1] is None:
            return None, None
        start, end = marks
        # The step's results were waited for, i.e. its last work; `end` was queued right
        # after it, with nothing between, so this wait is at most a few microseconds (and
        # elapsed_time refuses an event not yet reached).
        end.synchronize()
        idle = self._last_end.elapsed_time(start) if self._last_end is not None else None
        self._last_end = end
        return start.elapsed_time(end), idle


# ------------------------------------------------------------------------- summary

_INTERVALS = {
    "core": [("schedule", "started", "scheduled"), ("send to workers", "scheduled", "launched")],
    "worker": [("decode message", "received", "decoded"), ("prepare + launch", "decoded", "launched"),
               ("launch to sample", "launched", "sampled"),
               ("wait for results", "collect_start", "collected"), ("send results", "collected", "sent")],
    "grammar": [("advance + fill", "received", "filled"), ("tell the workers", "filled", "told")],
}


def _stats(values: list[float]) -> str:
    values = sorted(values)
    n = len(values)
    return (f"mean {sum(values) / n:8.2f}  p50 {values[n // 2]:8.2f}  p90 {values[int(n * 0.9)]:8.2f}  "
            f"sum {sum(values) / 1e3:8.2f} s")


def _traces(directory: str | Path) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """``(file name, role as named, e.g. worker0, records)`` of each trace file in ``directory``."""
    return [(path.name, path.name.split("-")[1],
             [json.loads(line) for line in path.read_text().splitlines() if line.strip()])
            for path in sorted(Path(directory).glob("steps-*.jsonl"))]


def summarize(directory: str | Path) -> list[str]:
    """One block of lines per trace file in ``directory`` (milliseconds unless said)."""
    lines: list[str] = []
    for name, role, records in _traces(directory):
        role = role.rstrip("0123456789")
        if not records:
            continue
        start = "started" if role == "core" else "received"
        span = records[-1][start] - records[0][start]
        lines.append(f"{name}: {len(records)} steps over {span:.2f} s")
        for name, a, b in _INTERVALS.get(role, []):
            values = [(r[b] - r[a]) * 1e3 for r in records if r.get(a) is not None and r.get(b) is not None]
            if values:
                lines.append(f"  {name:18s} {_stats(values)}")
        for key, name in (("mask_ms", "wait for bitmask"), ("wait_ms", "wait for workers"), ("update_ms", "apply outputs"),
                          ("gpu_ms", "device busy"), ("gpu_idle_ms", "device idle before")):
            values = [r[key] for r in records if r.get(key) is not None]
            if values:
                lines.append(f"  {name:18s} {_stats(values)}")
    return lines


# The time stamps of each role's records, in the order they happen.
_EVENTS = {
    "core": ("started", "scheduled", "launched", "ended"),
    "worker": ("received", "decoded", "launched", "sampled", "collect_start", "collected", "sent"),
    "grammar": ("received", "filled", "told"),
}


def timeline(directory: str | Path, steps: int, at: float = 0.5) -> list[str]:
    """Every process's events during ``steps`` consecutive engine-core steps, in time order
    (milliseconds from the first step's start): the chain of one step across the engine
    core, the workers and the grammar process, which per-process summaries cannot show.
    The steps start ``at`` of the way through the core's records (0.5: the middle).

    A core step's "tokens in" is its launch plus its wait for the workers (the core waits
    right after it launches); worker and grammar events are tagged with the step number
    (``seq``) they belong to.
    """
    by_role: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for _, role, records in _traces(directory):
        by_role.setdefault(role.rstrip("0123456789"), []).extend((role, r) for r in records)
    # (Steps that launched something: an idle engine core records empty steps too.)
    core = sorted((r for _, r in by_role.get("core", []) if r.get("num_reqs")), key=lambda r: r["started"])
    if not core:
        return []
    first = min(int(len(core) * at), max(0, len(core) - steps))
    window = core[first:first + steps]
    begin = window[0]["started"]
    end = core[first + steps]["started"] if first + steps < len(core) else window[-1]["ended"]
    # (time, order of the event within its record, text): equal times keep record order.
    events: list[tuple[float, int, str]] = []
    for r in window:
        events += [(r[k], i, f"core {k}") for i, k in enumerate(_EVENTS["core"])]
        events.append((r["launched"] + r.get("wait_ms", 0.0) / 1e3, 3,
                       f"core tokens in (waited {r.get('wait_ms', 0.0):.2f} ms, for the bitmask "
                       f"{r.get('mask_ms', 0.0):.2f} ms)"))
    for kind in ("worker", "grammar"):
        indent = "  " if kind == "worker" else "    "
        for role, r in by_role.get(kind, []):
            for i, k in enumerate(_EVENTS[kind]):
                if r.get(k) is not None and begin <= r[k] <= end:
                    events.append((r[k], i, f"{indent}{role} step {r.get('seq')} {k}"))
    return [f"{(t - begin) * 1e3:9.2f}  {what}" for t, _, what in sorted(events)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[1] == "--timeline" and args[2].isdigit():
        lines = timeline(args[0], int(args[2]))
    elif len(args) == 1:
        lines = summarize(args[0])
    else:
        print("usage: python -m forkless.metrics.step_trace DIR [--timeline STEPS]", file=sys.stderr)
        return 2
    print("\n".join(lines) if lines else f"no step traces (steps-*.jsonl) in {args[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
