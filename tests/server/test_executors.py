"""``--distributed-executor-backend uni | mp | PATH`` for the server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import plugin_env
from tests.server.conftest import (children_of, cmdline, descendants, kill_during_stream, start_server,
                                   stop_and_check)

EXECUTOR = '''
from forkless.executor.uniproc import UniProcExecutor
from forkless.logger import init_logger

logger = init_logger("forkless.test_executor")


class AnnouncingExecutor(UniProcExecutor):
    """The in-process executor, plus a log line proving this class was chosen."""

    def __init__(self, config):
        logger.warning("custom executor AnnouncingExecutor is running the model")
        super().__init__(config)


class NotAnExecutor:
    pass
'''


def executor_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "ex"
    folder.mkdir(exist_ok=True)
    (folder / "h4_test_executor.py").write_text(EXECUTOR)
    return folder


def spawned_children(pid: int) -> list[int]:
    return [c for c in children_of(pid) if "resource_tracker" not in cmdline(c)]


@pytest.mark.parametrize("backend", ["uni", "h4_test_executor:AnnouncingExecutor"])
def test_in_process_executors_serve_without_worker_processes(backend: str, tiny_llama: Path, tmp_path: Path) -> None:
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", "--distributed-executor-backend", backend,
                       env_extra={"PYTHONPATH": str(executor_dir(tmp_path))})
    try:
        r = srv.client().completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0)
        assert r.usage.completion_tokens == 4
        (engine_core,) = spawned_children(srv.proc.pid)
        assert spawned_children(engine_core) == []  # the model runs inside the engine core
        if backend != "uni":
            assert "custom executor AnnouncingExecutor is running the model" in srv.log()
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]


def test_executor_path_that_is_not_an_executor_fails_at_startup(tiny_llama: Path, tmp_path: Path) -> None:
    env = plugin_env(None, tmp_path, FORKLESS_PLUGINS="", PYTHONPATH=str(executor_dir(tmp_path)))
    proc = subprocess.run(
        [sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", str(tiny_llama), "--port", "0",
         "--max-model-len", "256", "--kv-cache-memory", str(32 << 20),
         "--distributed-executor-backend", "h4_test_executor:NotAnExecutor"],
        env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert "--distributed-executor-backend" in proc.stderr
    assert "not a subclass of forkless.executor.interface.Executor" in proc.stderr


def test_mp_executor_with_async_scheduling_serves_the_offline_engines_completions(tiny_llama: Path,
                                                                                   tmp_path: Path) -> None:
    # forkless serve runs its model in a worker process (mp, its default); with
    # --async-scheduling the engine core launches step N+1 there before collecting step N.
    # Greedy completions must be those of the offline engine stepping synchronously.
    from forkless import LLM, SamplingParams

    prompts = ["Hello", "The capital of France is", "1, 2, 3, 4,"]
    srv = start_server(tiny_llama, tmp_path, "--served-model-name", "tiny", "--distributed-executor-backend", "mp",
                       "--async-scheduling")
    try:
        client = srv.client()
        served = [[c.text for c in sorted(client.completions.create(
            model="tiny", prompt=p, max_tokens=12, n=2, extra_body={"top_k": 1}).choices, key=lambda c: c.index)]
            for p in prompts]
        batch = client.completions.create(model="tiny", prompt=prompts, max_tokens=12, temperature=0)
        engine_core, worker = srv.engine_pids()  # the model runs in a worker process
        assert worker != engine_core
        assert "--async-scheduling is not supported" not in srv.log()
        # The one worker runs on all the cores this machine gives it (with -tp N they are
        # shared), unless FORKLESS_WORKER_THREADS says otherwise: not one thread of two.
        from forkless.executor.multiproc import default_worker_threads

        threads = int(os.environ.get("FORKLESS_WORKER_THREADS") or default_worker_threads(1))
        assert f"worker process {worker}: {threads} torch threads" in srv.log(), srv.log()[-3000:]
        assert default_worker_threads(1) == len(os.sched_getaffinity(0))
    finally:
        assert stop_and_check(srv) == 0, srv.log()[-3000:]
    llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_memory=64 << 20)
    try:
        offline = [o.outputs[0].text for o in llm.generate(
            prompts, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)]
    finally:
        llm.llm_engine.shutdown()
    assert served == [[text, text] for text in offline]
    assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == offline


def test_worker_killed_during_async_steps_fails_the_request_and_stops_the_server(tiny_llama: Path,
                                                                                 tmp_path: Path) -> None:
    # With a step always in flight in the worker, its death is still noticed while the
    # engine core collects: the request fails (not hangs) and the server exits cleanly.
    srv = start_server(tiny_llama, tmp_path, "--max-model-len", "512", "--async-scheduling")
    processes = descendants(srv.proc.pid)
    try:
        _, worker = srv.engine_pids()
        client = srv.client(timeout=60)  # a hang fails the test instead of blocking it
        stream = client.completions.create(model=str(tiny_llama), prompt="Keep going", max_tokens=480,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))  # the request is running: steps are in flight
        kill_during_stream(srv, worker, stream, processes)
        assert "worker 0" in srv.log() and "died while the engine was running" in srv.log()
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
