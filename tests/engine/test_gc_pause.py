"""An offline run pauses Python's full collections and puts the collector back after.

A full collection walks the whole built engine and stalls the step loop (0.1-0.3 s each);
``LLM.generate`` freezes what exists for the run and unfreezes it at the end, so that a
cycle the user drops is still collected afterwards (forkless.gc_tuning).
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from forkless import LLM, SamplingParams
from forkless.gc_tuning import YOUNG_THRESHOLD, paused_full_collections


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture(autouse=True)
def _collector_as_python_starts():
    # The test process may run with other settings (another test, pytest itself).
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    gc.enable()
    yield
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


def test_generate_pauses_full_collections_and_restores_the_collector(llama_dir: Path) -> None:
    llm = LLM(str(llama_dir), max_model_len=256, max_num_seqs=8)
    seen: dict[str, object] = {}
    full: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    step = llm.llm_engine.step

    def step_and_look():
        seen.setdefault("frozen", gc.get_freeze_count())
        seen.setdefault("threshold", gc.get_threshold())
        gc.enable()
        gc.collect(1)  # a young collection must not reach what the run froze
        seen["kept"] = dropped() is not None
        return step()

    llm.llm_engine.step = step_and_look  # type: ignore[method-assign]
    # A cycle the user dropped just before the run (nothing collects it until the run
    # froze it: the collector is off until the first step).
    gc.disable()
    cycle = _Node()
    dropped = weakref.ref(cycle)
    del cycle
    gc.callbacks.append(on_gc)
    try:
        outs = llm.generate(["hello world"] * 4, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    finally:
        gc.callbacks.remove(on_gc)
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
    # During the run: the built engine frozen, young collections rare, no full one.
    assert seen["frozen"] > 10_000
    assert seen["threshold"] == (YOUNG_THRESHOLD, 10, 10)
    assert not full
    # The dropped cycle was frozen with the rest: kept through the run...
    assert seen["kept"]
    # ...and afterwards the collector is as before and frees it.
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == (700, 10, 10)
    gc.collect()
    assert dropped() is None
    llm.shutdown()


def _frozen(obj: object) -> bool:
    """Whether a tracked object is in the permanent generation (``gc.get_objects`` lists
    the three others). By identity, not by ``gc.get_freeze_count``: frozen objects that
    reference counting frees meanwhile lower the count."""
    return not any(o is obj for o in gc.get_objects())


def test_pause_is_shared_by_nested_runs_and_pauses_a_process_that_froze_some_objects() -> None:
    before = [1]  # tracked (a list), alive across the runs
    with paused_full_collections():
        assert gc.get_freeze_count() > 0 and _frozen(before)
        during = [2]
        with paused_full_collections():
            assert not _frozen(during)  # the inner run's start does not freeze again
        assert _frozen(before)  # the inner run's end does not unfreeze
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() == 0
    assert not _frozen(before) and not _frozen(during)
    assert gc.get_threshold() == (700, 10, 10)

    # Something froze a few objects before the run (as a library may): the run is still
    # paused (otherwise its full collections would walk the whole engine), and afterwards
    # the collector examines everything again.
    gc.freeze()
    assert gc.get_freeze_count() > 0
    with paused_full_collections():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == (700, 10, 10)
