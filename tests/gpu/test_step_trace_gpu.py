"""On CUDA the worker's step trace holds the device's busy and idle time of each step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forkless import SamplingParams
from forkless.config import EngineArgs
from forkless.engine.llm_engine import LLMEngine


def test_step_trace_measures_device_time(real_size_model: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKLESS_STEP_TRACE_DIR", str(tmp_path))
    config = EngineArgs(model=str(real_size_model), dtype="float32", max_model_len=256, kv_cache_memory=1 << 30,
                        distributed_executor_backend="mp", async_scheduling=True).create_engine_config()
    engine = LLMEngine(config)
    try:
        for i in range(4):
            engine.add_request(str(i), [100 + i] * 20, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.shutdown()
    (path,) = tmp_path.glob("steps-worker0-*.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) >= 16
    assert all(r["gpu_ms"] > 0 for r in records)
    assert records[0]["gpu_idle_ms"] is None and all(r["gpu_idle_ms"] >= 0 for r in records[1:])
