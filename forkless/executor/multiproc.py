"""The multiprocess executor: one spawned worker process per rank (``--distributed-executor-backend mp``).

Each worker process loads the general plugins itself, builds the platform's worker and
answers calls (``[method, msgpack args]``) on a ZeroMQ socket pair. The executor watches
the workers while it waits: a worker that dies fails the call within a fraction of a
second with an error naming it, so the engine core can report it instead of hanging.

The worker sockets go in the IPC directory this process inherited (the API server's,
in the engine core process), else in one the executor makes and removes at shutdown. A
worker whose parent is gone (killed) removes that directory before it exits.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import traceback
from typing import TYPE_CHECKING, Any

import zmq

from forkless import envs
from forkless.protocol.step import ModelRunnerOutput, SchedulerOutput
from forkless.protocol import ipc
from forkless.executor.interface import Executor
from forkless.logger import init_logger

if TYPE_CHECKING:
    from forkless.config import EngineConfig

logger = init_logger("forkless.executor.multiproc")

_WORKER_METHODS = ("determine_num_blocks", "initialize_cache", "execute_model", "check_health")
_POLL_MS = 100
_STARTUP_TIMEOUT_S = 900.0


class WorkerDiedError(RuntimeError):
    """A worker process exited while the engine needed it."""


def _worker_main(config_bytes: bytes, addr_in: str, addr_out: str, rank: int, parent_pid: int,
                 ipc_dir: str) -> None:
    """Entry point of a spawned worker process.

    Args:
        config_bytes: The engine configuration, msgpack.
        addr_in: Where calls come from (the executor binds it).
        addr_out: Where replies go (the executor binds it).
        rank: This worker's rank.
        parent_pid: The executor's process, watched to exit when it is gone.
        ipc_dir: The directory of the sockets, removed if the parent is gone at exit.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API server orchestrates shutdown
    from forkless.plugins import load_general_plugins

    load_general_plugins()
    threads = envs.FORKLESS_WORKER_THREADS
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    from forkless.config import EngineConfig
    from forkless.worker.worker import create_worker

    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.connect(addr_in)
    outbox = ctx.socket(zmq.PUSH)
    outbox.setsockopt(zmq.LINGER, 1000)
    outbox.connect(addr_out)
    try:
        config = EngineConfig.from_builtins(ipc.decode(config_bytes))
        worker = create_worker(config, rank=rank)
        worker.init_device()
        worker.load_model()
    except Exception as exc:
        outbox.send_multipart([ipc.FAILED, ipc.encode({"error": f"{type(exc).__name__}: {exc}",
                                                        "traceback": traceback.format_exc()})])
        os._exit(1)
    outbox.send_multipart([ipc.READY, ipc.encode({"pid": os.getpid(), "rank": rank})])
    while True:
        if not inbox.poll(1000):
            if not ipc.parent_alive(parent_pid):
                break  # the engine core is gone: do not linger as an orphan
            continue
        method, payload = inbox.recv_multipart()
        name = method.decode()
        if name == "shutdown":
            break
        try:
            if name not in _WORKER_METHODS:
                raise ValueError(f"unknown worker method {name!r}; expected one of {', '.join(_WORKER_METHODS)}")
            if name == "execute_model":
                result: Any = worker.execute_model(ipc.decode(payload, SchedulerOutput))
            else:
                result = getattr(worker, name)(*ipc.decode(payload))
            outbox.send_multipart([b"ok", ipc.encode(result)])
        except Exception as exc:
            outbox.send_multipart([b"error", ipc.encode({"error": f"{type(exc).__name__}: {exc}",
                                                          "traceback": traceback.format_exc()})])
    worker.shutdown()
    inbox.close(linger=0)
    outbox.close()
    ctx.term()
    ipc.remove_ipc_dir_if_orphaned(parent_pid, ipc_dir)


class MultiprocExecutor(Executor):
    """Worker processes behind ZeroMQ; this build runs one worker (world size 1)."""

    def __init__(self, config: "EngineConfig") -> None:
        super().__init__(config)
        self.world_size = 1
        inherited = ipc.inherited_ipc_dir()
        # Removed at shutdown only if made here; an inherited one is its maker's.
        self._owns_ipc_dir = inherited is None
        self.ipc_dir = ipc.make_ipc_dir("forkless-workers-") if inherited is None else inherited
        self.ctx = zmq.Context()
        mp = multiprocessing.get_context("spawn")
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.to_workers: list[zmq.Socket] = []
        self.from_workers: list[zmq.Socket] = []
        self.worker_pids: list[int] = []
        config_bytes = ipc.encode(config.to_builtins())
        for rank in range(self.world_size):
            addr_in = ipc.ipc_address(self.ipc_dir, f"to-worker-{rank}")
            addr_out = ipc.ipc_address(self.ipc_dir, f"from-worker-{rank}")
            push = self.ctx.socket(zmq.PUSH)
            push.bind(addr_in)
            pull = self.ctx.socket(zmq.PULL)
            pull.bind(addr_out)
            proc = mp.Process(target=_worker_main, name=f"forkless-worker-{rank}",
                              args=(config_bytes, addr_in, addr_out, rank, os.getpid(), self.ipc_dir))
            proc.start()
            logger.info("started worker process %d (pid %d); it imports torch and loads the model", rank, proc.pid)
            self.procs.append(proc)
            self.to_workers.append(push)
            self.from_workers.append(pull)
        for rank in range(self.world_size):
            kind, payload = self._receive(rank, _STARTUP_TIMEOUT_S, starting=True)
            data = ipc.decode(payload)
            if kind == ipc.FAILED:
                self.shutdown()
                raise RuntimeError(f"worker {rank} failed to start: {data['error']}\n{data['traceback']}")
            self.worker_pids.append(data["pid"])

    def _receive(self, rank: int, timeout_s: float | None, starting: bool = False) -> tuple[bytes, bytes]:
        sock, proc = self.from_workers[rank], self.procs[rank]
        waited = 0.0
        while True:
            if sock.poll(_POLL_MS):
                kind, payload = sock.recv_multipart()
                return kind, payload
            if not proc.is_alive():
                what = "while starting" if starting else "while the engine was running"
                raise WorkerDiedError(f"worker {rank} (pid {proc.pid}) died {what} "
                                      f"(exit code {proc.exitcode})")
            waited += _POLL_MS / 1000
            if timeout_s is not None and waited > timeout_s:
                raise TimeoutError(f"worker {rank} did not answer within {timeout_s:.0f} s")

    def _call(self, method: str, *args: Any, payload: bytes | None = None) -> list[bytes]:
        """Send one call to every worker; their replies, by rank."""
        data = ipc.encode(list(args)) if payload is None else payload
        for sock in self.to_workers:
            sock.send_multipart([method.encode(), data])
        results = []
        for rank in range(self.world_size):
            kind, reply = self._receive(rank, None)
            if kind == b"error":
                err = ipc.decode(reply)
                raise RuntimeError(f"worker {rank}: {method} failed: {err['error']}\n{err['traceback']}")
            results.append(reply)
        return results

    def determine_num_blocks(self) -> int:
        return min(ipc.decode(r, int) for r in self._call("determine_num_blocks"))

    def initialize_cache(self, num_blocks: int) -> None:
        self._call("initialize_cache", num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        replies = self._call("execute_model", payload=ipc.encode(scheduler_output))
        return ipc.decode(replies[0], ModelRunnerOutput)  # rank 0 samples for all

    def check_health(self) -> None:
        for rank, proc in enumerate(self.procs):
            if not proc.is_alive():
                raise WorkerDiedError(f"worker {rank} (pid {proc.pid}) is dead (exit code {proc.exitcode})")

    def shutdown(self) -> None:
        if not self.procs:
            return
        for sock, proc in zip(self.to_workers, self.procs):
            if proc.is_alive():
                try:
                    sock.send_multipart([b"shutdown", b""], flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for sock in self.to_workers + self.from_workers:
            sock.close(linger=0)
        self.ctx.term()
        self.procs = []
        if self._owns_ipc_dir:
            ipc.remove_ipc_dir(self.ipc_dir)
