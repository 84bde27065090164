"""The multiprocess executor: one spawned worker process per rank (``--distributed-executor-backend mp``).

With ``world_size`` (``-tp``) workers, every rank gets the same calls and runs the same
step; the ranks meet through ``torch.distributed`` at ``tcp://127.0.0.1:<free port>``
(each joins in ``Worker.init_device``). Rank 0's output is the step's; every rank's reply
is awaited, and a rank that dies or fails, at start-up or in a step, fails the call with
its name: while waiting for any rank the executor watches all of them, since the others
then wait in a collective for the dead one.

Each worker process loads the general plugins itself, builds the platform's worker and
answers calls (``[method, msgpack args]``) on a ZeroMQ socket pair. The executor watches
the workers while it sends and waits: a worker that dies fails the call within a fraction
of a second with an error naming it, so the engine core can report it instead of hanging.
Between calls a thread waits on the worker processes' sentinels (vLLM's worker monitor):
a worker that dies while the engine is idle is reported at once to the callback of
:meth:`MultiprocExecutor.register_failure_callback` (the engine core then fails as for a
step's failure), never during a shutdown, which sets ``stopping`` before any worker is
told to exit.

Async scheduling (``--async-scheduling``). Each worker says at start-up (in its ``ready``
message) whether its runner supports it; :attr:`MultiprocExecutor.supports_async_scheduling`
is true when every rank does. Invariants of the async steps:

    * ``execute_model_async`` sends ``[execute_model_async, (seq, SchedulerOutput)]`` to
      every rank without waiting and returns a handle naming ``seq`` (numbered from 0,
      one per step sent). Steps are collected in the order they were sent; collecting
      any other handle (an old one, a newer one first, another executor's) raises.
    * A worker keeps at most one step in flight: on a new step it launches it
      (``Worker.execute_model_async``) and only then collects the previous one and sends
      its output, so on a GPU step N+1 is queued behind step N -- unless step N is done
      already (``Worker.step_done``: the device idles anyway, and on the CPU, where a
      launch computes the step, always): then N's output goes first, and the engine core
      takes it in and plans N+2 while this worker prepares and launches N+1, instead of
      after (the two would otherwise run one after the other every step). Replies are
      ``[step_ok, (seq, ModelRunnerOutput)]`` or ``[step_error, (seq, error)]``, in ``seq``
      order; the executor checks ``seq`` against the handle it collects.
    * When the engine core collects the newest step sent, nothing newer would make the
      worker finish it: the executor sends ``[flush, seq]`` first. A worker with no step
      ``seq`` in flight (its launch failed and was already answered) ignores the flush.
    * A step's error (launch or collect) is answered for that step, after the outputs
      of the steps before it, so it surfaces on the matching :meth:`collect` with the
      worker's traceback. The output rank (the first of the last pipeline stage, rank 0
      without ``-pp``) samples for all: its output is returned, but every rank's reply
      is awaited and any rank's error raised.
    * With ``-pp`` N, up to N steps are in flight (micro-batches, one per stage). A
      worker then finishes its step in flight *before* launching the next: on the CPU a
      launch computes the whole stage, and the last stage's output must not wait for the
      next batch's compute (the engine core plans the next batch of those requests from
      it).
    * Structured outputs: a step planned with ``defer_sampling`` is launched as any other
      (its forward only) and sampled when ``[sample, (seq, where, nbytes)]`` arrives
      (``shared_memory.sample_message``): from the engine core, which sends it before
      anything is launched after that step and before it is collected, or from the
      grammar process that filled the bitmask, on a socket of its own each worker binds
      (:meth:`MultiprocExecutor.deferred_sample_route`); a worker takes that one before it
      launches or finishes anything after the step, and while it waits, reads the engine
      core's messages ahead (a shutdown ends the wait). The bitmask is not sent: it is
      filled into shared memory the executor made
      (:meth:`MultiprocExecutor.allocate_bitmask_buffer`), which each worker maps (and
      pins, on CUDA) and reads in place; ``where`` names the segment (``None``: no
      bitmask; ``""``: any other buffer, sent as a third frame). The buffer is refilled
      only after the step was collected, so no rank is still reading it. A rank with no
      step ``seq`` in flight (its launch failed and was answered) ignores the message; a
      sampling that fails is that step's answer. Where the plan names the grammar
      processes' token sockets (``SchedulerOutput.grammar_tokens_to``), rank 0 sends them
      the step's sampled tokens when it collects the step, before the step's output (and
      a ``None`` in their place when the launch or the collect failed), so the next
      fill does not wait for the tokens' trip through the engine core.
    * Synchronous calls (``execute_model`` and the start-up calls) are refused while async
      steps are uncollected: their replies would interleave with the steps'.
    * Shutdown drops a step in flight: the worker exits without collecting it.
    * An executor dropped without a shutdown, or left by an exiting interpreter (a
      script's uncaught exception, Ctrl-C, a forgotten ``llm.shutdown()``), stops its
      workers then (``ipc.release_with``): otherwise they would wait for a message, and
      ``multiprocessing`` would wait for them at exit, forever.

The worker sockets go in the IPC directory this process inherited (the API server's,
in the engine core process), else in one the executor makes and removes at shutdown. A
worker whose parent is gone (killed) removes that directory before it exits.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from collections import deque
from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import msgspec

import zmq

from forkless import envs
from forkless.protocol.kv_transfer import KVOutputAggregator
from forkless.protocol.step import ModelRunnerOutput, SchedulerOutput
from forkless.protocol import ipc
from forkless.executor.interface import Executor
from forkless.protocol.shared_memory import (SAMPLE, BitmaskSegments, Segment, decode_sample,
                                             grammar_tokens_message, sample_message)
from forkless.gc_tuning import tune_process
from forkless.logger import init_logger

if TYPE_CHECKING:
    from forkless.config import EngineConfig

logger = init_logger("forkless.executor.multiproc")

# collective_rpc runs any public worker method by name: [name, args, kwargs], msgpack.
_WORKER_METHODS = ("determine_num_blocks", "initialize_cache", "execute_model", "check_health", "collective_rpc")
# Async steps (see the module docstring): launch one, finish the one in flight.
_STEP = b"execute_model_async"
_FLUSH = b"flush"
_STEP_OK = b"step_ok"
_STEP_ERROR = b"step_error"
_POLL_MS = 100
_STARTUP_TIMEOUT_S = 900.0


class WorkerDiedError(RuntimeError):
    """A worker process exited while the engine needed it."""


def _worker_died(rank: int, proc: Any, starting: bool = False) -> WorkerDiedError:
    """The error naming worker ``rank``, whose process ``proc`` exited."""
    what = "while starting" if starting else "while the engine was running"
    return WorkerDiedError(f"worker {rank} (pid {proc.pid}) died {what} (exit code {proc.exitcode})")


class _WorkerWatch:
    """A daemon thread that waits for any of ``procs`` to exit and reports the first
    (:class:`WorkerDiedError`) to the failure callback, unless ``stopping`` was set first
    (a shutdown). It refers to the processes, not to the executor, whose finalizer must
    still run when it is dropped."""

    def __init__(self, procs: list[Any], stopping: threading.Event) -> None:
        self._procs = list(procs)
        self._stopping = stopping
        self._lock = threading.Lock()
        self._error: WorkerDiedError | None = None
        self._callback: Callable[[BaseException], None] | None = None
        threading.Thread(target=self._run, name="forkless-worker-watch", daemon=True).start()

    def _run(self) -> None:
        rank_of = {proc.sentinel: rank for rank, proc in enumerate(self._procs)}
        ready = multiprocessing.connection.wait(list(rank_of))
        if self._stopping.is_set():
            return
        rank = rank_of[ready[0]]
        self._procs[rank].join(5)  # reaped: its exit code, for the message
        if self._stopping.is_set():
            return
        error = _worker_died(rank, self._procs[rank])
        with self._lock:  # (the callback is called once, here or in set_callback)
            self._error, callback = error, self._callback
        if callback is not None:
            callback(error)

    def set_callback(self, callback: Callable[[BaseException], None]) -> None:
        with self._lock:
            self._callback, error = callback, self._error
        if error is not None:
            callback(error)


@dataclass(frozen=True)
class StepHandle:
    """An async step sent to the workers, for :meth:`MultiprocExecutor.collect`.

    Attributes:
        seq: The step's number (0, 1, ... in the order sent).
        owner: The ``id()`` of the executor that sent it.
    """

    seq: int
    owner: int


def _error_payload(exc: BaseException) -> dict[str, str]:
    """The wire form of an exception caught in the worker (message and traceback)."""
    return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def default_worker_threads(local_workers: int | None) -> int:
    """torch threads of a worker process when ``FORKLESS_WORKER_THREADS`` is unset.

    Args:
        local_workers: Worker processes of this executor on this host (``None``: a Ray
            actor, which reserves one CPU of its node).

    Returns:
        An equal share of the cores this process may run on, at least 1 (one worker on
        two cores: 2; ``-tp 2`` there: 1 each), or 1 for a Ray actor.
    """
    if local_workers is None:
        return 1
    return max(1, envs.usable_cores() // max(1, local_workers))


def _prepare_process(local_workers: int | None = None) -> None:
    """What every worker process does first: load the general plugins (their loading
    rules hold in every process) and set its torch threads (``FORKLESS_WORKER_THREADS``,
    else :func:`default_worker_threads`)."""
    from forkless.plugins import load_general_plugins

    load_general_plugins()
    threads = envs.FORKLESS_WORKER_THREADS
    source = "FORKLESS_WORKER_THREADS"
    if threads is None:
        threads = default_worker_threads(local_workers)
        source = "its share of the host's cores" if local_workers is not None else "one per Ray actor"
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    logger.info("worker process %d: %d torch threads (%s)", os.getpid(), torch.get_num_threads(),
                source if threads > 0 else "torch's default")


def _build_worker(config_bytes: bytes, rank: int, local_rank: int | None = None,
                  init_method: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The platform's worker of ``rank``, its device and model ready, as every worker
    process builds it; and its ``ready`` message (pid, rank, async scheduling)."""
    from forkless.config import EngineConfig
    from forkless.worker.worker import create_worker

    config = EngineConfig.from_builtins(ipc.decode(config_bytes))
    worker = create_worker(config, rank=rank, local_rank=local_rank, distributed_init_method=init_method)
    worker.init_device()
    worker.load_model()
    # Declared by the worker (its runner's answer), asked once: the executor reports it.
    ready = {"pid": os.getpid(), "rank": rank, "async_scheduling": bool(worker.supports_async_scheduling)}
    gc.enable()  # (an mp worker built with it off: _worker_main)
    tune_process()  # this process is forkless's alone (forkless.gc_tuning)
    return worker, ready


def _run_call(worker: Any, name: str, payload: bytes) -> Any:
    """Run one allow-listed synchronous worker method, its arguments decoded."""
    if name not in _WORKER_METHODS:
        raise ValueError(f"unknown worker method {name!r}; expected one of {', '.join(_WORKER_METHODS)}")
    if name == "execute_model":
        return worker.execute_model(ipc.decode(payload, SchedulerOutput))
    if name == "collective_rpc":
        from forkless.worker.worker import call_worker_method  # (this process has torch already)

        method, args, kwargs = ipc.decode(payload)
        result = call_worker_method(worker, method, args, kwargs)
        try:
            return msgspec.Raw(ipc.encode(result))  # (encoded here, to name the method if it cannot be)
        except TypeError as exc:
            raise TypeError(f"collective_rpc({method!r}) returned a {type(result).__name__}, which cannot "
                            f"cross to the engine core as msgpack ({exc}): return plain data") from None
    return getattr(worker, name)(*ipc.decode(payload))


def rpc_payload(method: Any, timeout: float | None, args: Any, kwargs: Any) -> bytes:
    """A ``collective_rpc`` call for workers in other processes, checked and msgpack-encoded.

    Raises:
        TypeError: ``method`` is not a name (a callable cannot cross: nothing is pickled),
            or an argument is not plain data.
        ValueError: ``timeout`` is not a positive number or ``None``.
    """
    if not isinstance(method, str):
        what = "a callable" if callable(method) else f"a {type(method).__name__}"
        raise TypeError(f"collective_rpc method must be the name of a worker method, got {what}: forkless sends "
                        "no pickled code to worker processes (define the method on a worker class, "
                        "worker_cls='pkg.module.Class', or use distributed_executor_backend='uni')")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise ValueError(f"collective_rpc timeout={timeout!r} is invalid: expected seconds > 0 or None")
    if not isinstance(args, (list, tuple)):
        raise TypeError(f"collective_rpc args must be a tuple or list, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"collective_rpc kwargs must be a dict or None, got {type(kwargs).__name__}")
    try:
        return ipc.encode([method, list(args), kwargs or {}])
    except TypeError as exc:
        raise TypeError(f"collective_rpc({method!r}): its arguments cannot cross to the workers as msgpack "
                        f"({exc}): pass plain data") from None


def _device_step_timer() -> Any:
    """Device timing events for the step trace (a ``CudaStepTimer``), where the platform is CUDA."""
    from forkless.metrics.step_trace import CudaStepTimer
    from forkless.platforms import current_platform

    return CudaStepTimer() if current_platform.device_type == "cuda" else None


class _SharedBitmask:
    """A worker process's map of the engine core's shared bitmask segment (see the module
    docstring): the segment named in the newest ``sample`` message, pinned once where the
    worker can."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.name: str | None = None
        self.segment: Segment | None = None
        self.pinned: Any = None

    def view(self, name: str, nbytes: int) -> memoryview:
        """The first ``nbytes`` of segment ``name`` (mapped on first use; a segment the
        engine core replaced, when it grew, is unmapped: no step reads it any more)."""
        if name != self.name:
            self.close()
            self.segment = Segment(name=name)
            self.name = name
            self.pinned = self.worker.register_host_buffer(self.segment.buf)
        assert self.segment is not None
        return self.segment.buf[:nbytes]

    def close(self) -> None:
        if self.segment is None:
            return
        if self.pinned is not None:
            self.worker.unregister_host_buffer(self.pinned)
        self.pinned = None
        self.segment.release()
        self.segment = self.name = None


def _free_port() -> int:
    """A TCP port free on the loopback now, for the ranks' rendezvous."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker_main(config_bytes: bytes, addr_in: str, addr_out: str, rank: int, parent_pid: int,
                 ipc_dir: str, init_method: str | None = None, local_workers: int = 1,
                 addr_sample: str | None = None) -> None:
    """Entry point of a spawned worker process.

    Args:
        config_bytes: The engine configuration, msgpack.
        addr_in: Where calls come from (the executor binds it).
        addr_out: Where replies go (the executor binds it).
        rank: This worker's rank.
        parent_pid: The executor's process, watched to exit when it is gone.
        ipc_dir: The directory of the sockets, removed if the parent is gone at exit.
        init_method: The ranks' ``torch.distributed`` rendezvous (several workers only).
        local_workers: The executor's worker processes (all on this host): they share its cores.
        addr_sample: Where this worker binds the socket that deferred steps' ``sample``
            messages come to from another process (the grammar process); ``None``: none.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API server orchestrates shutdown
    ipc.leave_sigterm_to_parent(parent_pid)  # (also of a SIGTERM to the process group)
    # The collector is off while torch is imported and the model built (everything made
    # now lives as long as the process; walking it again and again was ~12 % of the CPU
    # of `import torch` and the model runner's imports); _build_worker turns it back on.
    gc.disable()
    _prepare_process(local_workers)
    ctx, inbox, outbox = ipc.connect_to_parent(addr_in, addr_out)
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)
    sample_inbox = None
    try:
        if addr_sample is not None:
            sample_inbox = ctx.socket(zmq.PULL)
            sample_inbox.bind(addr_sample)
            poller.register(sample_inbox, zmq.POLLIN)
        worker, ready = _build_worker(config_bytes, rank, init_method=init_method)
    except Exception as exc:
        outbox.send_multipart([ipc.FAILED, ipc.encode(_error_payload(exc))])
        # Deliver it before exiting: os._exit does not wait for ZeroMQ's I/O thread (closing
        # a socket does not either; terminating its context does), and the error (a bad
        # flag, most often) was lost in two starts of three.
        ctx.destroy(linger=5000)
        os._exit(1)
    outbox.send_multipart([ipc.READY, ipc.encode(ready)])
    # Pipeline stages: the step before goes out before the next one is launched.
    finish_first = worker.config.parallel_config.pipeline_parallel_size > 1
    # The async step launched and not yet collected: (seq, the runner's handle); and
    # whether it was launched with defer_sampling and its sample message has not come.
    pending: tuple[int, Any] | None = None
    unsampled = False
    # The engine core's messages read while waiting for a sample message (await_sample),
    # handled after it, in order.
    backlog: deque[list[Any]] = deque()
    # The sample messages of the step in flight come so far, where several grammar
    # processes each send one (their ``where``), by seq.
    sample_parts: dict[int, list[str | None]] = {}
    # FORKLESS_STEP_TRACE_DIR: one record per async step (forkless.metrics.step_trace).
    from forkless.metrics.step_trace import StepTrace

    trace = StepTrace.open(f"worker{rank}")
    timer = _device_step_timer() if trace is not None else None
    shared = _SharedBitmask(worker)
    traced: dict[int, dict[str, Any]] = {}
    # Rank 0 sends deferred steps' tokens to the grammar processes (routes_grammar_tokens):
    # the route of each step in flight, by seq, and a PUSH socket per grammar process.
    token_routes: dict[int, tuple[tuple[int, list[str]], list[str]]] = {}
    to_grammar: dict[str, Any] = {}

    def send_grammar_tokens(route: tuple[tuple[int, list[str]], list[str]],
                            output: ModelRunnerOutput | None) -> None:
        # A deferred step's tokens, straight to the grammar processes (None: it failed).
        (fill_id, addresses), ids = route
        tokens = None
        if output is not None:
            sampled = output.sampled_token_ids
            tokens = [t[0] if (t := sampled.get(rid)) else -1 for rid in ids]
        ipc.push_to_peers(ctx, to_grammar, addresses, grammar_tokens_message(fill_id, tokens))

    def finish_pending() -> None:
        # Collect the step in flight and send its output (or its error), tagged with seq.
        nonlocal pending
        if pending is None:
            return
        (seq, handle), pending = pending, None
        route = token_routes.pop(seq, None)
        collect_start = collected = StepTrace.now() if trace is not None else 0.0
        try:
            output = worker.collect(handle)
            if trace is not None:
                collected = StepTrace.now()
            if route is not None:
                send_grammar_tokens(route, output)  # first: they are on the next sampling's chain
                route = None
            outbox.send_multipart([_STEP_OK, ipc.encode([seq, output])])
        except Exception as exc:
            if route is not None:
                send_grammar_tokens(route, None)
            outbox.send_multipart([_STEP_ERROR, ipc.encode([seq, _error_payload(exc)])])
        if trace is not None:
            gpu_ms, idle_ms = timer.read(seq) if timer is not None else (None, None)
            trace.add(**traced.pop(seq, {"seq": seq}), collect_start=collect_start, collected=collected,
                      sent=StepTrace.now(), gpu_ms=gpu_ms, gpu_idle_ms=idle_ms)

    def sample(frames: list[Any]) -> None:
        # A sample message, from the engine core or the grammar process.
        nonlocal pending, unsampled
        seq, where, nbytes, parts = decode_sample(frames[1].bytes)
        if pending is None or pending[0] != seq:
            return  # its launch failed and was answered already
        if parts > 1:
            # One of several grammar processes' rows: sampled once all have come.
            got = sample_parts.get(seq)
            if got is None:
                sample_parts.clear()  # parts of a step that failed before all came
                got = sample_parts[seq] = []
            got.append(where)
            if len(got) < parts:
                return
            del sample_parts[seq]
            if None in got:
                where = None
        unsampled = False
        if trace is not None and seq in traced:
            traced[seq]["sampled"] = StepTrace.now()
        try:
            bitmask = None if where is None else frames[2].buffer if where == "" else shared.view(where, nbytes)
            worker.sample_deferred(pending[1], bitmask)
        except Exception as exc:
            pending = None
            outbox.send_multipart([_STEP_ERROR, ipc.encode([seq, _error_payload(exc)])])

    def await_sample() -> bool:
        # Before a launch or a collect: the step in flight's sample message, where it is
        # still to come from the grammar process (the engine core's own comes before
        # anything it sends next). False: a shutdown came, or the engine core is gone.
        while unsampled:
            ready = dict(poller.poll(1000))
            if sample_inbox is not None and sample_inbox in ready:
                sample(sample_inbox.recv_multipart(copy=False))
            elif inbox in ready:
                frames = inbox.recv_multipart(copy=False)
                if frames[0].bytes == SAMPLE:
                    sample(frames)
                elif frames[0].bytes == b"shutdown":
                    return False
                else:
                    backlog.append(frames)
            elif not ready and not ipc.parent_alive(parent_pid):
                return False
        return True

    while True:
        if backlog:
            frames = backlog.popleft()
        else:
            ready = dict(poller.poll(1000))
            if not ready:
                if not ipc.parent_alive(parent_pid):
                    break  # the engine core is gone: do not linger as an orphan
                continue
            if sample_inbox is not None and sample_inbox in ready:
                sample(sample_inbox.recv_multipart(copy=False))
                continue
            # Not copied out of the socket's frames: a step's bitmask is megabytes.
            frames = inbox.recv_multipart(copy=False)
        method, payload = frames[0].bytes, frames[1].bytes
        if method == SAMPLE:
            sample(frames)
            continue
        if method == b"shutdown":
            break  # a step in flight is dropped: its output has no reader any more
        if method == _STEP:
            # Launch the new step before finishing the previous one: on a GPU it is then
            # queued behind it and the device never waits for this process.
            received = StepTrace.now() if trace is not None else 0.0
            seq, scheduler_output = ipc.decode(payload, tuple[int, SchedulerOutput])
            decoded = StepTrace.now() if trace is not None else 0.0
            if not await_sample():  # (the new step reads the one in flight's tokens)
                break
            if timer is not None:
                timer.start(seq)
            if finish_first or (pending is not None and worker.step_done(pending[1])):
                finish_pending()
            try:
                launched, error = worker.execute_model_async(scheduler_output), None
            except Exception as exc:
                launched, error = None, _error_payload(exc)
            route = scheduler_output.grammar_tokens_to if rank == 0 else None
            if trace is not None:
                if timer is not None:
                    timer.end(seq)
                traced[seq] = {"seq": seq, "num_reqs": len(scheduler_output.scheduled_requests),
                               "num_tokens": scheduler_output.num_batched_tokens, "received": received,
                               "decoded": decoded, "launched": StepTrace.now()}
            finish_pending()  # its reply goes out before this step's
            if error is not None:
                if trace is not None:  # never collected: no record
                    traced.pop(seq, None)
                    if timer is not None:
                        timer.drop(seq)
                if route is not None:
                    send_grammar_tokens((route, []), None)
                outbox.send_multipart([_STEP_ERROR, ipc.encode([seq, error])])
            else:
                pending = (seq, launched)
                unsampled = scheduler_output.defer_sampling
                if route is not None:
                    token_routes[seq] = (route, scheduler_output.structured_output_request_ids)
            continue
        if not await_sample():
            break
        if method == _FLUSH:
            # Only the step named: a flush for a step whose launch failed (already
            # answered) must not finish anything else.
            if pending is not None and pending[0] == ipc.decode(payload, int):
                finish_pending()
            continue
        finish_pending()  # the executor never interleaves calls with steps; keep order if it did
        try:
            outbox.send_multipart([b"ok", ipc.encode(_run_call(worker, method.decode(), payload))])
        except Exception as exc:
            outbox.send_multipart([b"error", ipc.encode(_error_payload(exc))])
    if trace is not None:
        trace.close()
    worker.shutdown()
    shared.close()  # after the worker: a dropped step's copy from it may have been queued
    for sock in to_grammar.values():
        sock.close()
    inbox.close(linger=0)
    if sample_inbox is not None:
        sample_inbox.close(linger=0)
    outbox.close()
    ctx.term()
    ipc.remove_ipc_dir_if_orphaned(parent_pid, ipc_dir)
    ipc.exit_process(0)


class RankedWorkersExecutor(Executor):
    """An executor whose workers, one per rank, all answer every call (``mp``, ``ray``): the
    methods that do not depend on how the calls travel.

    Subclasses implement :meth:`_call` and set ``_async_ok`` (whether every rank's runner
    supports async scheduling) once their workers are up.
    """

    _async_ok = False
    #: The seqs of the async steps sent and not collected yet, oldest first (subclasses).
    _in_flight: deque[int]

    @property
    def supports_deferred_sampling(self) -> bool:
        """Whether steps may be launched with ``defer_sampling`` (as async scheduling)."""
        return self._async_ok

    def _check_uncollected(self, pending: Any) -> None:
        """Raise unless ``pending`` names a step of this executor sent and not collected
        (what :meth:`sample_deferred` takes)."""
        if not isinstance(pending, StepHandle) or pending.owner != id(self) or pending.seq not in self._in_flight:
            raise RuntimeError(f"sample_deferred({pending!r}): not an uncollected step of this executor")

    @abstractmethod
    def _call(self, method: str, *args: Any, payload: Any = None, timeout_s: float | None = None) -> list[bytes]:
        """Run a worker method on every rank (``args`` msgpack-encoded, or ``payload``
        as it is); the msgpack replies by rank (``TimeoutError`` after ``timeout_s``)."""

    def _step_payload(self, scheduler_output: SchedulerOutput) -> Any:
        """What carries one step to the workers (msgpack bytes)."""
        return ipc.encode(scheduler_output)

    def determine_num_blocks(self) -> int:
        return min(ipc.decode(r, int) for r in self._call("determine_num_blocks"))

    def collective_rpc(self, method: str | Callable[..., Any], timeout: float | None = None,
                       args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
        """Every rank's answer, decoded from msgpack (see :func:`rpc_payload` for what may cross).

        Raises:
            TimeoutError: Some rank did not answer within ``timeout`` seconds.
            RuntimeError: A worker raised (its message and traceback).
        """
        payload = rpc_payload(method, timeout, args, kwargs)
        return [ipc.decode(r) for r in self._call("collective_rpc", payload=payload, timeout_s=timeout)]

    def initialize_cache(self, num_blocks: int) -> None:
        self._call("initialize_cache", num_blocks)

    @property
    def output_rank(self) -> int:
        """The rank whose step output is the engine's: the first of the last pipeline
        stage (only the last stage samples; its TP ranks sample alike)."""
        parallel = self.config.parallel_config
        return (parallel.pipeline_parallel_size - 1) * parallel.tensor_parallel_size

    @property
    def max_concurrent_batches(self) -> int:
        return self.config.parallel_config.pipeline_parallel_size

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self._output_from(self._call("execute_model", payload=self._step_payload(scheduler_output)))

    @property
    def _merges_kv(self) -> bool:
        """Whether every rank's KV connector output must be merged (``-tp`` / ``-pp`` with
        ``--kv-transfer-config``)."""
        return self.config.kv_transfer_config is not None and self.config.parallel_config.world_size > 1

    @functools.cached_property
    def _kv_aggregator(self) -> KVOutputAggregator:
        """Merges the ranks' KV connector outputs across steps (only with ``_merges_kv``)."""
        return KVOutputAggregator(self.config.parallel_config.world_size)

    def _step_output(self, outputs: list[ModelRunnerOutput]) -> ModelRunnerOutput:
        """The output rank's output, carrying the KV connector news of every rank."""
        output = outputs[self.output_rank]
        if self._merges_kv:
            output.kv_connector_output = self._kv_aggregator.aggregate([o.kv_connector_output for o in outputs])
        return output

    def _output_from(self, replies: list[bytes]) -> ModelRunnerOutput:
        """:meth:`_step_output` of the ranks' msgpack replies (only the output rank's is
        decoded when nothing is merged)."""
        if not self._merges_kv:
            return ipc.decode(replies[self.output_rank], ModelRunnerOutput)
        return self._step_output([ipc.decode(reply, ModelRunnerOutput) for reply in replies])

    @property
    def supports_async_scheduling(self) -> bool:
        """Whether every worker's runner can launch steps before collecting the last one."""
        return self._async_ok


def _release_workers(procs: list, to_workers: list, from_workers: list, ctx: zmq.Context,
                     segments: BitmaskSegments, ipc_dir: str | None, stopping: threading.Event) -> None:
    """Stop the worker processes (a shutdown message, then terminate, then kill), close
    the sockets and the shared bitmask, and remove ``ipc_dir`` (``None``: not this
    executor's). Empties ``procs`` and the socket lists, which the executor shares.
    ``stopping`` is set first: the workers' exits are no failure."""
    stopping.set()
    for sock, proc in zip(to_workers, procs):
        if proc.is_alive():
            try:
                sock.send_multipart([b"shutdown", b""], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
    for proc in procs:
        ipc.stop_process(proc, 10)
    for sock in to_workers + from_workers:
        sock.close(linger=0)
    ctx.term()
    procs.clear()
    to_workers.clear()
    from_workers.clear()
    segments.close()
    if ipc_dir is not None:
        ipc.remove_ipc_dir(ipc_dir)


class MultiprocExecutor(RankedWorkersExecutor):
    """Worker processes behind ZeroMQ, one per rank (``parallel_config.world_size``)."""

    def __init__(self, config: "EngineConfig") -> None:
        super().__init__(config)
        self.world_size = config.parallel_config.world_size
        init_method = f"tcp://127.0.0.1:{_free_port()}" if self.world_size > 1 else None
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
        # Where each worker takes sample messages from the grammar process (deferred_sample_route).
        self._sample_addresses: list[str] = []
        # Async steps: whether every rank supports them (from its ready message), the
        # next seq to send, and the seqs sent and not collected yet, oldest first.
        self._async_ok = True
        self._next_seq = 0
        self._in_flight: deque[int] = deque()
        # Per rank, replies still to come of calls that timed out (collective_rpc's timeout).
        self._late_replies = [0] * self.world_size
        # The shared memory of the grammar bitmask (allocate_bitmask_buffer), newest last.
        self._bitmask_segments = BitmaskSegments()
        # Set when the workers are being stopped: their exits are no failure (_WorkerWatch).
        self._stopping = threading.Event()
        # Stops the workers at shutdown, or when this executor is dropped or the
        # interpreter exits without one; the lists are filled below, in place.
        self._release = ipc.release_with(self, _release_workers, self.procs, self.to_workers, self.from_workers,
                                         self.ctx, self._bitmask_segments,
                                         self.ipc_dir if self._owns_ipc_dir else None, self._stopping)
        config_bytes = ipc.encode(config.to_builtins())
        for rank in range(self.world_size):
            addr_in = ipc.ipc_address(self.ipc_dir, f"to-worker-{rank}")
            addr_out = ipc.ipc_address(self.ipc_dir, f"from-worker-{rank}")
            self._sample_addresses.append(ipc.ipc_address(self.ipc_dir, f"sample-{rank}"))
            push = self.ctx.socket(zmq.PUSH)
            push.bind(addr_in)
            pull = self.ctx.socket(zmq.PULL)
            pull.bind(addr_out)
            proc = mp.Process(target=_worker_main, name=f"forkless-worker-{rank}",
                              args=(config_bytes, addr_in, addr_out, rank, os.getpid(), self.ipc_dir,
                                    init_method, self.world_size, self._sample_addresses[rank]))
            proc.start()
            logger.info("started worker process %d (pid %d); it imports torch and loads the model", rank, proc.pid)
            self.procs.append(proc)
            self.to_workers.append(push)
            self.from_workers.append(pull)
        # Ranks answer in any order; one that fails leaves the others waiting for it at
        # the rendezvous, so its own answer (or death) is what gets reported.
        pids: dict[int, int] = {}
        while len(pids) < self.world_size:
            try:
                rank, kind, payload = self._receive_any(set(range(self.world_size)) - set(pids), _STARTUP_TIMEOUT_S)
            except (WorkerDiedError, TimeoutError):
                self.shutdown()
                raise
            data = ipc.decode(payload)
            if kind == ipc.FAILED:
                self.shutdown()
                raise ipc.ChildStartError(f"worker {rank} failed to start: {data['error']}", data["traceback"])
            pids[rank] = data["pid"]
            self._async_ok = self._async_ok and bool(data["async_scheduling"])
        self.worker_pids = [pids[rank] for rank in range(self.world_size)]
        self._watch = _WorkerWatch(self.procs, self._stopping)

    def register_failure_callback(self, callback: Callable[[BaseException], None]) -> None:
        """``callback(WorkerDiedError)`` when a worker process exits outside a shutdown,
        from the watch thread (at once if one did already)."""
        self._watch.set_callback(callback)

    def _died(self, rank: int, starting: bool = False) -> WorkerDiedError:
        return _worker_died(rank, self.procs[rank], starting)

    def _send(self, rank: int, frames: list[Any], copy: bool = True) -> None:
        """Send without blocking on a dead worker (a PUSH with no peer would wait forever);
        ``copy=False``: the frames' buffers are sent as they are, later, by ZeroMQ's I/O
        thread (the caller leaves them unchanged until the reply)."""
        sock, proc = self.to_workers[rank], self.procs[rank]
        while True:
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=copy)
                return
            except zmq.Again:
                if not proc.is_alive():
                    raise self._died(rank) from None
                sock.poll(_POLL_MS, zmq.POLLOUT)

    def _dead_peer(self, grace_s: float = 2.0) -> WorkerDiedError | None:
        """The first worker found dead within ``grace_s`` (several workers only), else None.

        A rank whose peer was killed sees its collective fail (connection reset) about when
        the peer's exit becomes visible here: the grace lets that death, the cause, be
        reported rather than its echo.
        """
        if self.world_size == 1:
            return None
        for _ in range(max(1, int(grace_s * 1000 / _POLL_MS))):
            for rank, proc in enumerate(self.procs):
                if not proc.is_alive():
                    return self._died(rank)
            time.sleep(_POLL_MS / 1000)
        return None

    def _receive_any(self, ranks: set[int], timeout_s: float) -> tuple[int, bytes, bytes]:
        """The first start-up answer of ``ranks``: ``(rank, kind, payload)``.

        Raises:
            WorkerDiedError: A worker (any rank) exited first.
            TimeoutError: None answered within ``timeout_s``.
        """
        poller = zmq.Poller()
        for rank in ranks:
            poller.register(self.from_workers[rank], zmq.POLLIN)
        waited = 0.0
        while True:
            ready = dict(poller.poll(_POLL_MS))
            for rank in sorted(ranks):
                if self.from_workers[rank] in ready:
                    kind, payload = self.from_workers[rank].recv_multipart()
                    return rank, kind, payload
            for rank, proc in enumerate(self.procs):
                if not proc.is_alive() and (rank in ranks or proc.exitcode != 0):
                    # Its answer (the error that made it exit) may land just after the exit.
                    if rank in ranks and self.from_workers[rank].poll(500):
                        kind, payload = self.from_workers[rank].recv_multipart()
                        return rank, kind, payload
                    raise self._died(rank, starting=True)
            waited += _POLL_MS / 1000
            if waited > timeout_s:
                raise TimeoutError(f"workers {sorted(ranks)} did not answer within {timeout_s:.0f} s")

    def _receive(self, rank: int, timeout_s: float | None, starting: bool = False) -> tuple[bytes, bytes]:
        sock = self.from_workers[rank]
        waited = 0.0
        while True:
            if sock.poll(_POLL_MS):
                kind, payload = sock.recv_multipart()
                return kind, payload
            # Any rank: with several, the others wait in a collective for a dead one.
            for other, proc in enumerate(self.procs):
                if not proc.is_alive():
                    raise self._died(other, starting)
            waited += _POLL_MS / 1000
            if timeout_s is not None and waited > timeout_s:
                raise TimeoutError(f"worker {rank} did not answer within {timeout_s:.0f} s")

    def _call(self, method: str, *args: Any, payload: bytes | None = None,
              timeout_s: float | None = None) -> list[bytes]:
        """Send one call to every worker; their replies, by rank.

        Raises:
            RuntimeError: A worker raised (its message and traceback), or async steps
                are uncollected (their replies would come first).
            TimeoutError: ``timeout_s`` passed before every rank answered; the late
                replies are dropped when they come (before the next call's).
        """
        if self._in_flight:
            raise RuntimeError(f"{method} called while async steps {list(self._in_flight)} are not "
                               "collected: collect() them first")
        data = ipc.encode(list(args)) if payload is None else payload
        for rank in range(self.world_size):
            self._drop_late_replies(rank)
            self._send(rank, [method.encode(), data])
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        results = []
        for rank in range(self.world_size):
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                kind, reply = self._receive(rank, left)
            except TimeoutError:
                for late in range(rank, self.world_size):
                    self._late_replies[late] += 1
                raise TimeoutError(f"{method}: worker {rank} did not answer within {timeout_s:g} s") from None
            if kind == b"error":
                err = ipc.decode(reply)
                failure = RuntimeError(f"worker {rank}: {method} failed: {err['error']}\n{err['traceback']}")
                # A collective fails on the living ranks when a peer dies: name the dead one.
                raise self._dead_peer() or failure from failure
            if kind != b"ok":
                raise RuntimeError(f"worker {rank} answered {method} with {kind!r}: the call protocol is out of step")
            results.append(reply)
        return results

    def _drop_late_replies(self, rank: int) -> None:
        """Read and drop the replies of calls that timed out on ``rank`` (it answers in
        order), so that the next reply read is the next call's."""
        while self._late_replies[rank]:
            self._receive(rank, None)
            self._late_replies[rank] -= 1

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> StepHandle:
        """Send one step to every worker without waiting for it.

        Returns:
            The handle to pass to :meth:`collect`, in the order the steps were sent.

        Raises:
            WorkerDiedError: A worker is dead.
        """
        for rank in range(self.world_size):
            self._drop_late_replies(rank)
        seq = self._next_seq
        self._next_seq += 1
        data = ipc.encode([seq, scheduler_output])
        # In flight before the send: a send that fails leaves the executor unusable
        # anyway (a dead worker), and collect() then names the step.
        self._in_flight.append(seq)
        for rank in range(self.world_size):
            self._send(rank, [_STEP, data])
        return StepHandle(seq, id(self))

    def sample_deferred(self, pending: StepHandle, grammar_bitmask: bytes | bytearray | None) -> None:
        """Have every rank sample ``pending``'s step with ``grammar_bitmask`` (sent, not
        awaited: a rank samples before it launches the next step, and a failure comes
        with the step's output at :meth:`collect`).

        Raises:
            RuntimeError: ``pending`` is not an uncollected step of this executor.
            WorkerDiedError: A worker is dead.
        """
        self._check_uncollected(pending)
        segment = self._bitmask_segments.newest
        if grammar_bitmask is None:
            frames: list[Any] = sample_message(pending.seq, None, 0)
        elif (segment is not None and isinstance(grammar_bitmask, memoryview)
              and grammar_bitmask.obj is segment.buf.obj):
            # Filled in place: the workers read it there.
            frames = sample_message(pending.seq, segment.name, len(grammar_bitmask))
        else:
            frames = sample_message(pending.seq, "", len(grammar_bitmask)) + [grammar_bitmask]
        for rank in range(self.world_size):
            self._send(rank, frames, copy=False)

    def deferred_sample_route(self, pending: StepHandle) -> tuple[int, list[str]]:
        """Each worker binds a socket for sample messages from the grammar process, which
        fills the shared segment (:meth:`allocate_shared_bitmask_buffer`).

        Raises:
            RuntimeError: ``pending`` is not an uncollected step of this executor.
        """
        self._check_uncollected(pending)
        return pending.seq, self._sample_addresses

    @property
    def routes_grammar_tokens(self) -> bool:
        """Rank 0's worker sends a deferred step's tokens to the plan's grammar processes
        (``SchedulerOutput.grammar_tokens_to``) before the step's output."""
        return True

    def allocate_bitmask_buffer(self, nbytes: int) -> memoryview:
        """``nbytes`` of a shared-memory segment every worker maps: the engine core fills a
        step's bitmask there and only its name crosses the socket (a bitmask of 256 rows
        of a 151,936-token vocabulary is 4.9 MB). The segment grows by doubling; one
        outgrown is unlinked at once (its name) and unmapped at shutdown."""
        return self._bitmask_segments.view(nbytes)[1]

    @property
    def supports_shared_bitmask_buffer(self) -> bool:
        return True

    def allocate_shared_bitmask_buffer(self, nbytes: int) -> tuple[str, memoryview]:
        """The same buffer as :meth:`allocate_bitmask_buffer`, and its segment's name (the
        grammar process maps it and fills it there)."""
        return self._bitmask_segments.view(nbytes)

    def collect(self, pending: StepHandle) -> ModelRunnerOutput:
        """Wait for the output of the oldest uncollected step, which ``pending`` must name.

        Raises:
            RuntimeError: ``pending`` is not the oldest step in flight (collected
                already, out of order, or another executor's), or a worker raised in the
                step (its message and traceback).
            WorkerDiedError: A worker died before answering.
        """
        if not isinstance(pending, StepHandle) or pending.owner != id(self):
            raise RuntimeError(f"collect({pending!r}): not a step handle of this executor")
        seq = pending.seq
        if not self._in_flight or self._in_flight[0] != seq:
            if seq >= self._next_seq:
                raise RuntimeError(f"collect(step {seq}): no such step was sent")
            if not self._in_flight or seq < self._in_flight[0]:
                raise RuntimeError(f"collect(step {seq}): that step was already collected")
            raise RuntimeError(f"collect(step {seq}) out of order: step {self._in_flight[0]} was sent "
                               "before it and must be collected first")
        self._in_flight.popleft()
        if seq == self._next_seq - 1:
            # No newer step was sent to make the workers finish this one: ask them to.
            flush = ipc.encode(seq)
            for rank in range(self.world_size):
                self._send(rank, [_FLUSH, flush])
        outputs: list[ModelRunnerOutput | None] = []
        failure: RuntimeError | None = None
        # Every rank answers every step: read them all, so that the next collect starts
        # at its own step's replies even after an error here.
        for rank in range(self.world_size):
            kind, reply = self._receive(rank, None)
            if kind == _STEP_OK:
                got, result = ipc.decode(reply, tuple[int, ModelRunnerOutput])
            elif kind == _STEP_ERROR:
                got, err = ipc.decode(reply, tuple[int, dict[str, str]])
                result = None
                if failure is None:
                    failure = RuntimeError(f"worker {rank}: step {seq} (execute_model_async) failed: "
                                           f"{err['error']}\n{err['traceback']}")
            else:
                raise RuntimeError(f"worker {rank} answered step {seq} with {kind!r}: "
                                   "the step protocol is out of step")
            if got != seq:
                raise RuntimeError(f"worker {rank} answered step {got} while step {seq} was collected: "
                                   "outputs would be mixed up")
            outputs.append(result)
        if failure is not None:
            raise failure
        return self._step_output(outputs)  # type: ignore[arg-type]

    def check_health(self) -> None:
        for rank, proc in enumerate(self.procs):
            if not proc.is_alive():
                raise WorkerDiedError(f"worker {rank} (pid {proc.pid}) is dead (exit code {proc.exitcode})")

    def shutdown(self) -> None:
        # A step in flight is dropped (the workers exit without collecting it).
        self._in_flight.clear()
        self._release()
