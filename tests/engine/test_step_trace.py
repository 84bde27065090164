"""FORKLESS_STEP_TRACE_DIR: the engine core and the multiprocess worker write one record per async step."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from forkless import SamplingParams
from forkless.metrics.step_trace import StepTrace, main, summarize, timeline
from tests.engine.test_engine_mp_async import _engine


def test_trace_is_off_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORKLESS_STEP_TRACE_DIR", raising=False)
    assert StepTrace.open("core") is None


def test_mp_worker_records_every_step_in_order(llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture) -> None:
    trace_dir = tmp_path / "trace"
    monkeypatch.setenv("FORKLESS_STEP_TRACE_DIR", str(trace_dir))  # inherited by the spawned worker
    engine = _engine(llama_dir)
    try:
        engine.add_request("a", "Hello there", SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
        engine.add_request("b", "Once upon", SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True))
        steps = 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
    finally:
        engine.shutdown()  # the worker flushes its records as it exits
    files = list(trace_dir.glob("steps-worker0-*.jsonl"))
    assert len(files) == 1
    records = [json.loads(line) for line in files[0].read_text().splitlines()]
    # One record per launched step (prefill + decodes), in launch order, each with its
    # timings in the order they happen; no device timings on the CPU.
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert 9 <= len(records) <= steps
    for r in records:
        assert r["received"] <= r["decoded"] <= r["launched"] <= r["collect_start"] <= r["collected"] <= r["sent"]
        assert r["gpu_ms"] is None and r["gpu_idle_ms"] is None
    assert records[0]["num_tokens"] > records[-1]["num_tokens"] == 1  # the prompts, then one decode
    # A step done when the next arrives (always on the CPU, where the launch computes it)
    # is answered before the next one is launched: the engine core takes its output in
    # while the worker prepares the next (before, the two ran one after the other).
    for done, nxt in zip(records, records[1:]):
        assert done["sent"] <= nxt["launched"], (done, nxt)
    (core_file,) = trace_dir.glob("steps-core-*.jsonl")
    core = [json.loads(line) for line in core_file.read_text().splitlines()]
    assert len(core) == steps
    for r in core:
        assert r["started"] <= r["scheduled"] <= r["launched"] <= r["ended"]
        assert r["wait_ms"] >= 0 and r["update_ms"] >= 0
    # Every launched step's plan is recorded once, and every sampled token came back.
    assert sum(r["num_reqs"] > 0 for r in core) == len(records)
    assert sum(r["num_outputs"] for r in core) >= 6 + 9
    lines = summarize(trace_dir)
    assert any(line.startswith(core_file.name) for line in lines)
    assert any(line.startswith(files[0].name) for line in lines) and any("prepare + launch" in line for line in lines)
    assert any("wait for workers" in line for line in lines)
    assert main([str(trace_dir)]) == 0
    assert "wait for results" in capsys.readouterr().out


def test_the_grammar_process_and_deferred_samplings_are_traced(tiny_llama: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With structured outputs through ``mp`` the grammar process writes one record per
    deferred fill (taken, written, workers told), and the worker's record of a deferred
    step says when its ``sample`` message came."""
    from forkless import LLM, StructuredOutputsParams

    trace_dir = tmp_path / "trace"
    monkeypatch.setenv("FORKLESS_STEP_TRACE_DIR", str(trace_dir))
    llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=1 << 24, async_scheduling=True,
              distributed_executor_backend="mp")
    try:
        out = llm.generate([f"x{i}" for i in range(4)], SamplingParams(
            max_tokens=12, structured_outputs=StructuredOutputsParams(regex="[a-z]{20}")), use_tqdm=False)
    finally:
        llm.shutdown()
    assert all(re.fullmatch("[a-z]{1,20}", o.outputs[0].text) for o in out)
    (grammar_file,) = trace_dir.glob("steps-grammar-*.jsonl")
    fills = [json.loads(line) for line in grammar_file.read_text().splitlines()]
    assert len(fills) >= 3
    for r in fills:
        assert r["received"] <= r["filled"] <= r["told"] and 1 <= r["rows"] <= 4 and isinstance(r["seq"], int)
    (worker_file,) = trace_dir.glob("steps-worker0-*.jsonl")
    sampled = [json.loads(line) for line in worker_file.read_text().splitlines()]
    sampled = {r["seq"]: r for r in sampled if "sampled" in r}
    # Each fill the process routed is the sampling of the worker's step of that number
    # (but the last step launched, which nothing collects once every request is done).
    routed = [r for r in fills if r["seq"] in sampled]
    assert len(routed) >= len(fills) - 1
    for r in routed:
        step = sampled[r["seq"]]
        assert step["launched"] <= step["sampled"] <= step["collect_start"], (r, step)
        # The worker samples once the bitmask is written (it may do so before the process
        # stamps "told": the send returns before the message is taken).
        assert r["filled"] <= step["sampled"], (r, step)
    lines = summarize(trace_dir)
    assert any("advance + fill" in line for line in lines) and any("launch to sample" in line for line in lines)
    # The timeline lays the three processes' events of two steps out in time order.
    lines = timeline(trace_dir, 2)
    times = [float(line.split()[0]) for line in lines]
    assert times == sorted(times) and times[0] == 0.0
    assert sum("core started" in line for line in lines) == 2
    assert any("worker0 step" in line and "sampled" in line for line in lines)
    assert any("grammar step" in line and "told" in line for line in lines)
    assert main([str(trace_dir), "--timeline", "2"]) == 0
    assert main([str(trace_dir), "--timeline"]) == 2
