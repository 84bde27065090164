"""``--async-scheduling`` with the ``mp`` executor: real worker processes, tiny random Llama.

The engine core launches step N+1 in the worker process before it collects step N. The
outputs must be those of the in-process (``uni``) executor stepping synchronously, for
greedy, ``n > 1``, stop conditions, requests that force synchronous steps and aborts; a
failing or dying worker must surface on the step it broke, quickly, naming the worker.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from forkless import SamplingParams
from forkless.config import EngineArgs
from forkless.engine.llm_engine import LLMEngine
from forkless.executor.multiproc import MultiprocExecutor, StepHandle, WorkerDiedError
from forkless.protocol.step import ModelRunnerOutput, SchedulerOutput
from tests.engine.mp_workers import FAIL_AT_STEP
from tests.engine.test_engine_parity import PROMPTS


# Every prompt with every kind of request; the history-dependent ones (seed, penalties,
# min_tokens) make the engine step synchronously while they run, the others overlap.
CASES: list[tuple[str, SamplingParams]] = [
    *((p, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)) for p in PROMPTS),
    # top_k=1: greedy in effect, unseeded (greedy itself allows only n=1, as vLLM).
    (PROMPTS[1], SamplingParams(top_k=1, max_tokens=9, n=3, ignore_eos=True)),
    (PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[5, 17, 42])),
    (PROMPTS[3], SamplingParams(temperature=0.0, max_tokens=20, stop=["e", "a"])),
    (PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=15, logprobs=2, prompt_logprobs=1)),
    (PROMPTS[4], SamplingParams(temperature=0.8, seed=3, max_tokens=10, n=2)),
    (PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=10, repetition_penalty=1.3, min_tokens=4)),
    (PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=10, presence_penalty=0.5)),
]


def _args(model_dir: Path, backend: str, async_scheduling: bool, **kwargs: Any) -> EngineArgs:
    return EngineArgs(model=str(model_dir), dtype="float32", kv_cache_memory=1 << 22,
                      distributed_executor_backend=backend, async_scheduling=async_scheduling, **kwargs)


def _engine(model_dir: Path, backend: str = "mp", async_scheduling: bool = True, worker_cls: str | None = None,
            **kwargs: Any) -> LLMEngine:
    config = _args(model_dir, backend, async_scheduling, **kwargs).create_engine_config()
    if worker_cls is not None:
        config.parallel_config.worker_cls = worker_cls
    return LLMEngine(config)


def _summary(out: Any) -> list[tuple]:
    """What must not change: per completion its tokens, text, finish and logprobs."""
    def logprobs(entries: Any) -> Any:
        if entries is None:
            return None
        return [None if e is None else {t: (round(lp.logprob, 3), lp.rank) for t, lp in e.items()} for e in entries]

    return [(c.index, c.token_ids, c.text, c.finish_reason, c.stop_reason, logprobs(c.logprobs),
             logprobs(out.prompt_logprobs)) for c in out.outputs]


def _drain(engine: LLMEngine) -> None:
    # A step launched after the last output was taken is still in flight: collect it.
    core = engine.engine_core
    while core.has_unfinished_requests():
        core.step()


def _run(engine: LLMEngine, cases: list[tuple[str, SamplingParams]],
         abort: tuple[int, str] | None = None) -> dict[str, list[tuple]]:
    """Run ``cases`` to the end; ``abort=(k, id)`` aborts request ``id`` after step ``k``."""
    for i, (prompt, params) in enumerate(cases):
        engine.add_request(f"r{i}", prompt, params)
    finals: dict[str, list[tuple]] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = _summary(out)
        steps += 1
        if abort is not None and steps == abort[0]:
            engine.abort_request(abort[1])
    _drain(engine)
    return finals


def _assert_no_leak(engine: LLMEngine) -> None:
    kv = engine.engine_core.scheduler.kv_cache_manager
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_blocks


@pytest.fixture(scope="module")
def reference(llama_dir: Path) -> dict[str, list[tuple]]:
    engine = _engine(llama_dir, backend="uni", async_scheduling=False)
    try:
        return _run(engine, CASES)
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def mp_async(llama_dir: Path):
    engine = _engine(llama_dir)
    yield engine
    engine.shutdown()


def _close(got: dict, want: dict) -> None:
    # Logprobs are compared to 3 decimals; a rounding edge would differ by 0.001.
    assert got.keys() == want.keys()
    for rid in want:
        for g, w in zip(got[rid], want[rid], strict=True):
            assert g[:5] == w[:5], rid
            for gl, wl in ((g[5], w[5]), (g[6], w[6])):
                assert (gl is None) == (wl is None), rid
                for ge, we in zip(gl or [], wl or [], strict=True):
                    assert (ge is None) == (we is None) and (ge or {}).keys() == (we or {}).keys(), rid
                    for t in ge or {}:
                        assert ge[t][1] == we[t][1] and ge[t][0] == pytest.approx(we[t][0], abs=2e-3), rid


def test_mp_executor_runs_async_on_cpu(mp_async: LLMEngine) -> None:
    # The CPU runner supports async scheduling (built-in logits processors only), and the
    # worker process says so at start-up.
    executor = mp_async.engine_core.executor
    assert isinstance(executor, MultiprocExecutor)
    assert executor.supports_async_scheduling
    assert mp_async.engine_core.async_scheduling


def test_mp_async_outputs_equal_uni_sync(mp_async: LLMEngine, reference: dict) -> None:
    _close(_run(mp_async, CASES), reference)
    _assert_no_leak(mp_async)
    _close(_run(mp_async, CASES), reference)  # again: no state left over in the worker


def test_mp_async_keeps_a_step_in_flight(mp_async: LLMEngine, reference: dict) -> None:
    # Greedy-only requests never force a synchronous step: after the first steps one is
    # always launched and uncollected.
    greedy = CASES[:5]
    for i, (prompt, params) in enumerate(greedy):
        mp_async.add_request(f"r{i}", prompt, params)
    in_flight = 0
    finals = {}
    while mp_async.has_unfinished_requests():
        for out in mp_async.step():
            if out.finished:
                finals[out.request_id] = _summary(out)
        in_flight += mp_async.engine_core._pending is not None
    _drain(mp_async)
    assert in_flight >= 10
    _close(finals, {f"r{i}": reference[f"r{i}"] for i in range(5)})


def test_mp_async_abort_mid_way(mp_async: LLMEngine, reference: dict) -> None:
    got = _run(mp_async, CASES, abort=(3, "r3"))
    assert "r3" not in got  # aborted by the caller: no final output
    _close(got, {k: v for k, v in reference.items() if k != "r3"})
    _assert_no_leak(mp_async)
    # Later on, the n=3 request: all its children go.
    got = _run(mp_async, CASES, abort=(6, "r5"))
    _close(got, {k: v for k, v in reference.items() if k != "r5"})
    _assert_no_leak(mp_async)


def test_handles_are_collected_in_order_once(mp_async: LLMEngine) -> None:
    _drain(mp_async)
    executor = mp_async.engine_core.executor
    assert isinstance(executor, MultiprocExecutor)
    empty = SchedulerOutput()
    first = executor.execute_model_async(empty)
    second = executor.execute_model_async(empty)
    with pytest.raises(RuntimeError, match="out of order: step .* must be collected first"):
        executor.collect(second)
    with pytest.raises(RuntimeError, match="not collected: collect"):
        executor.execute_model(empty)  # its reply would come after the steps'
    assert executor.collect(first) == ModelRunnerOutput()
    with pytest.raises(RuntimeError, match="already collected"):
        executor.collect(first)
    assert executor.collect(second) == ModelRunnerOutput()  # the newest: flushed
    with pytest.raises(RuntimeError, match="not a step handle of this executor"):
        executor.collect(StepHandle(second.seq + 1, owner=0))
    with pytest.raises(RuntimeError, match="no such step was sent"):
        executor.collect(StepHandle(second.seq + 1, owner=second.owner))
    assert executor.execute_model(empty) == ModelRunnerOutput()  # synchronous steps still work
    assert executor.collect(executor.execute_model_async(empty)) == ModelRunnerOutput()


def test_sync_steps_with_mp_and_runner_without_async(llama_dir: Path, reference: dict) -> None:
    # The worker reports that its runner cannot overlap steps: --async-scheduling falls
    # back to synchronous steps, as with the uni executor.
    engine = _engine(llama_dir, worker_cls="tests.engine.mp_workers:NoAsyncWorker")
    try:
        assert not engine.engine_core.executor.supports_async_scheduling
        assert not engine.engine_core.async_scheduling
        _close(_run(engine, CASES[:6]), {f"r{i}": reference[f"r{i}"] for i in range(6)})
    finally:
        engine.shutdown()


@pytest.mark.parametrize("worker_cls,where", [("FailOnLaunch", "launch"), ("FailOnCollect", "collect")])
def test_worker_exception_in_async_step_surfaces_with_traceback(llama_dir: Path, worker_cls: str,
                                                                where: str) -> None:
    engine = _engine(llama_dir, worker_cls=f"tests.engine.mp_workers:{worker_cls}")
    try:
        assert engine.engine_core.async_scheduling
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
        outputs = 0
        with pytest.raises(RuntimeError) as info:
            while engine.has_unfinished_requests():
                outputs += len(engine.step())
        message = str(info.value)
        assert message.startswith(f"worker 0: step {FAIL_AT_STEP - 1} (execute_model_async) failed: "
                                  f"RuntimeError: injected {where} failure"), message
        assert "Traceback" in message and "mp_workers.py" in message  # the worker's own
        assert outputs > 0  # the steps before it came back
    finally:
        t0 = time.monotonic()
        engine.shutdown()  # with steps possibly in flight
        assert time.monotonic() - t0 < 10
    assert not engine.engine_core.executor.procs


def test_killed_worker_during_async_steps_raises_quickly(llama_dir: Path) -> None:
    engine = _engine(llama_dir)
    executor = engine.engine_core.executor
    assert isinstance(executor, MultiprocExecutor)
    proc = executor.procs[0]
    try:
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
        for _ in range(4):
            engine.step()
        assert engine.engine_core._pending is not None  # a step is in flight
        os.kill(executor.worker_pids[0], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError, match=r"worker 0 \(pid \d+\) died while the engine was running"):
            for _ in range(1000):
                engine.step()
        assert time.monotonic() - t0 < 1.5
    finally:
        engine.shutdown()
    assert not proc.is_alive()
    assert not os.path.exists(executor.ipc_dir)


def test_shutdown_with_a_step_in_flight(llama_dir: Path) -> None:
    engine = _engine(llama_dir)
    executor = engine.engine_core.executor
    assert isinstance(executor, MultiprocExecutor)
    proc = executor.procs[0]
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert engine.engine_core._pending is not None
    t0 = time.monotonic()
    engine.shutdown()
    assert time.monotonic() - t0 < 5  # the worker exits on the shutdown message, not the 10 s join
    assert not proc.is_alive() and proc.exitcode == 0
    assert not os.path.exists(executor.ipc_dir)
    engine.shutdown()  # idempotent


def test_a_worker_that_fails_to_start_reports_its_error_every_time(llama_dir: Path) -> None:
    # The worker sent its error and exited at once; ZeroMQ's I/O thread died with it before
    # the message left, in two starts of three ("died while starting (exit code 1)" alone).
    for _ in range(4):
        with pytest.raises(RuntimeError, match=r"worker 0 failed to start: ValueError: --kv-cache-dtype fp8 is "
                                               r"not supported by the 'cpu' attention backend") as info:
            _engine(llama_dir, kv_cache_dtype="fp8")
        # The message is one line; the worker's traceback (the cause) comes as a note,
        # which Python prints with the exception.
        assert "\n" not in str(info.value)
        (note,) = info.value.__notes__
        assert note.startswith("the child's traceback:\nTraceback") and "raise ValueError" in note
