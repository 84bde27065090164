"""A script that exits without shutting the engine down (an uncaught exception, a forgotten
``shutdown()``), or drops it, still exits promptly and leaves no process or IPC directory
behind.

The worker and engine core processes are not daemons; ``multiprocessing`` joins such
children when the interpreter exits, and they wait for a shutdown message: without
``ipc.release_with`` the script hung forever.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

OFFLINE = """
import sys
from forkless import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(sys.argv[1], max_model_len=256, kv_cache_memory=1 << 22, distributed_executor_backend="mp",
              async_scheduling=True)
    llm.generate(["Hello"], SamplingParams(max_tokens=3), use_tqdm=False)
    print("PIDS", *llm.llm_engine.engine_core.executor.worker_pids, flush=True)
    raise RuntimeError("the user's own error")
"""

SERVING = """
import asyncio, sys
from forkless import SamplingParams
from forkless.config import EngineArgs
from forkless.engine.async_llm import AsyncLLM

async def run():
    llm = AsyncLLM.from_engine_args(EngineArgs(model=sys.argv[1], max_model_len=256, kv_cache_memory=1 << 22))
    await llm.start()
    async for out in llm.generate("Hello", SamplingParams(max_tokens=3), "r1"):
        pass
    print("PIDS", llm.client.pid, flush=True)
    return llm  # kept alive past the event loop, never shut down

if __name__ == "__main__":
    kept = asyncio.run(run())
    raise RuntimeError("the user's own error")
"""


DROPPED = """
import gc, os, sys, time
from forkless import LLM, SamplingParams

def run(model):
    llm = LLM(model, max_model_len=256, kv_cache_memory=1 << 22, distributed_executor_backend="mp")
    llm.generate(["Hello"], SamplingParams(max_tokens=3), use_tqdm=False)
    return llm.llm_engine.engine_core.executor.worker_pids

if __name__ == "__main__":
    pids = run(sys.argv[1])  # the LLM is dropped here, never shut down
    gc.collect()
    print("PIDS", *pids, flush=True)
    print("ALIVE AFTER GC", *[p for p in pids if os.path.exists(f"/proc/{p}")], flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not reaped yet by a parent that exited) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("script", [OFFLINE, SERVING, DROPPED], ids=["offline-mp-executor", "async-llm", "dropped"])
def test_a_script_that_leaves_its_engine_exits(tiny_llama: Path, tmp_path: Path, script: str) -> None:
    (tmp_path / "script.py").write_text(textwrap.dedent(script))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(REPO))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(tmp_path / "script.py"), str(tiny_llama)], env=env,
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    if script == DROPPED:
        # Garbage collection stopped the worker while the script still ran.
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split("ALIVE AFTER GC", 1)[1].split() == []
    else:
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "RuntimeError: the user's own error" in proc.stderr
    assert "Exception ignored in atexit" not in proc.stderr, proc.stderr[-3000:]
    assert took < 60, f"the script took {took:.0f} s to exit"
    pids = [int(p) for p in proc.stdout.split("PIDS", 1)[1].split("\n", 1)[0].split()]
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "a child process outlived the script"
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("forkless-")]


INTERRUPTED = """
import signal
import sys
from forkless import LLM, SamplingParams

if __name__ == "__main__":
    # As in a terminal: a test run started in the background (`cmd &` without job control)
    # hands its children SIGINT ignored, and Python then installs no KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    llm = LLM(sys.argv[1], max_model_len=256, kv_cache_memory=1 << 22, distributed_executor_backend="mp")
    print("PIDS", *llm.llm_engine.engine_core.executor.worker_pids, flush=True)
    while True:
        llm.generate(["Hello"] * 4, SamplingParams(max_tokens=200, ignore_eos=True), use_tqdm=False)
"""


def test_ctrl_c_during_generate_exits(tiny_llama: Path, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) in the middle of ``generate``: the
    script ends with its KeyboardInterrupt within seconds, and its worker with it."""
    (tmp_path / "script.py").write_text(textwrap.dedent(INTERRUPTED))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, str(tmp_path / "script.py"), str(tiny_llama)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = proc.stdout.readline()  # once the engine is up; generate() runs from here on
        assert line.startswith("PIDS"), proc.stderr.read()[-3000:] if proc.poll() is not None else line
        pids = [int(p) for p in line.split()[1:]]
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "KeyboardInterrupt" in err, err[-3000:]
    assert took < 30, f"the script took {took:.0f} s to exit after Ctrl-C"
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "a worker outlived the script"
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("forkless-")]


ENDED_BY_EXIT_PROCESS = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from forkless.protocol.ipc import exit_process

out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
pool = ThreadPoolExecutor(1)
pool.submit(lambda: (time.sleep(0.5), (out / "pool").write_text("finished")))
worker = threading.Thread(target=lambda: (time.sleep(0.5), (out / "thread").write_text("finished")))
worker.start()
sys.stdout.write("buffered, no newline")
exit_process(3)
"""


def test_exit_process_ends_a_process_as_the_interpreter_would(tmp_path: Path) -> None:
    """The forkless processes (and the ``forkless`` command) end through
    ``ipc.exit_process``, which skips the interpreter's teardown: what a plugin leaves to
    the process's end still happens (its ``atexit`` handlers, its thread pools' and
    threads' last work, its buffered output), and the exit status is the one given."""
    script = tmp_path / "script.py"
    script.write_text(ENDED_BY_EXIT_PROCESS)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stdout == "buffered, no newline"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "pool").read_text() == "finished"
    assert (tmp_path / "thread").read_text() == "finished"
