"""The engine core process: scheduler, KV-cache manager and executor in a busy loop.

Started with ``spawn`` by the API server. It receives requests and aborts on one ZeroMQ
socket and pushes ``EngineCoreOutputs`` on another. When the executor fails (a worker
died), it reports ``DEAD`` with the reason and exits, so the API server can fail the
in-flight requests at once instead of letting them hang. A worker that dies while the
engine is idle is reported by the executor's failure callback
(``Executor.register_failure_callback``) and fails the engine the same way, within one
idle poll (``IDLE_POLL_MS``), not at the next request.

It works in the API server's IPC directory (its executor puts the worker sockets there).
The API server removes that directory; but when the API server is gone (killed) as the
engine core exits, the engine core removes it.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import time
import traceback
from typing import Any

import msgspec

from forkless.gc_tuning import tune_process
from forkless.protocol import ipc
from forkless.logger import init_logger

logger = init_logger("forkless.engine.core_proc")

IDLE_POLL_MS = 100
STATS_INTERVAL_S = 1.0
# The engine core's methods a client may call between steps (ipc.UTILITY; AsyncLLM's
# methods of the same names). Their refusals (ValueError, TypeError, RuntimeError,
# AttributeError) go back to the caller, and whatever a worker method run by
# collective_rpc raises; anything else fails the engine, as a failed step does, and so
# does check_health's failure.
UTILITY_METHODS = frozenset({"reset_prefix_cache", "sleep", "check_sleep", "wake_up", "is_sleeping",
                             "pause", "is_pause_complete", "resume", "is_paused",
                             "collective_rpc", "check_health"})


class EngineCoreProc:
    """Runs an ``EngineCore`` behind two sockets until told to stop or its parent dies.

    ``log_stats`` is the engine core's (:class:`forkless.engine.core.EngineCore`): record
    each request's lifecycle events for the API server's per-request statistics.
    """

    def __init__(self, config_bytes: bytes, input_addr: str, output_addr: str, parent_pid: int,
                 log_stats: bool = False) -> None:
        import zmq

        from forkless.config import EngineConfig
        from forkless.engine.core import EngineCore

        self.parent_pid = parent_pid
        self.ctx = zmq.Context()
        self.input = self.ctx.socket(zmq.PULL)
        self.input.connect(input_addr)
        self.output = self.ctx.socket(zmq.PUSH)
        self.output.setsockopt(zmq.LINGER, 2000)
        self.output.connect(output_addr)
        try:
            config = EngineConfig.from_builtins(ipc.decode(config_bytes))
            self.core = EngineCore(config, log_stats=log_stats)
        except Exception as exc:
            # A worker's failure carries the worker's traceback (the cause); the API server
            # reports it, once.
            cause = exc.child_traceback if isinstance(exc, ipc.ChildStartError) else traceback.format_exc()
            error = str(exc) if isinstance(exc, ipc.ChildStartError) else f"{type(exc).__name__}: {exc}"
            self._send(ipc.FAILED, {"error": error, "traceback": cause})
            # Delivered before the process exits (os._exit would kill ZeroMQ's I/O thread
            # with the message still queued): the API server reports it; nobody else does.
            self.close()
            raise
        # Set from the executor's watch thread; raised by run() on the main thread.
        self._executor_failure: BaseException | None = None
        self.core.executor.register_failure_callback(self._executor_failed)
        self._send(ipc.READY, {
            "pid": os.getpid(),
            "num_blocks": config.cache_config.num_blocks,
            "worker_pids": list(getattr(self.core.executor, "worker_pids", [os.getpid()])),
        })
        self.running = True
        self.last_stats = 0.0

    def _executor_failed(self, error: BaseException) -> None:
        self._executor_failure = error

    def _send(self, kind: bytes, payload: Any) -> None:
        self.output.send_multipart([kind, ipc.encode(payload)], copy=False)

    def _handle(self, kind: bytes, payload: bytes) -> None:
        from forkless.protocol.engine import EngineCoreRequest

        if kind == ipc.ADD:
            try:
                req = ipc.decode(payload, EngineCoreRequest)
            except msgspec.ValidationError as exc:
                # (The API server decodes each request as here before sending it; another
                # client's malformed one fails alone, not the engine.)
                self._send(ipc.REQUEST_ERROR, {"request_id": _request_id(payload), "error": f"invalid request: {exc}"})
                return
            try:
                self.core.add_request(req)
            except ValueError as exc:
                self._send(ipc.REQUEST_ERROR, {"request_id": req.request_id, "error": str(exc)})
            # (While the engine sleeps it is paused too -- AsyncLLM.sleep pauses first -- so
            # a request waits for the wake-up: EngineSleepingError is the offline engine's.)
        elif kind == ipc.UTILITY:
            self._send(ipc.UTILITY_RESULT, self._utility(ipc.decode(payload)))
        elif kind == ipc.ABORT:
            self.core.abort_requests(ipc.decode(payload, list[str]))
            self._send_stats()  # aborted requests' blocks are free now: show it
        elif kind == ipc.SHUTDOWN:
            self.running = False

    def _send_request_errors(self) -> None:
        # Requests a worker could not run (their LoRA adapter failed to load), or that a
        # resume() could not queue: each fails alone, with the reason, as a request the
        # engine refused.
        for request_id, reason in self.core.take_request_errors():
            self._send(ipc.REQUEST_ERROR, {"request_id": request_id, "error": reason})
        # Requests that failed on this side (a KV load under kv_load_failure_policy
        # "fail"): a server error for their clients, not a refusal.
        for request_id, reason in self.core.take_request_failures():
            self._send(ipc.REQUEST_ERROR, {"request_id": request_id, "error": reason, "status": 500})

    def _send_stats(self) -> None:
        from forkless.protocol.engine import EngineCoreOutputs

        self.last_stats = time.monotonic()
        self._send(ipc.OUTPUTS, EngineCoreOutputs(outputs=[], scheduler_stats=self.core.make_stats(),
                                                  timestamp=time.time(), monotonic_timestamp=self.last_stats))

    def run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self.input, zmq.POLLIN)
        while self.running:
            busy = self.core.has_work()
            timeout = 0 if busy else IDLE_POLL_MS
            while True:
                events = dict(poller.poll(timeout))
                if self.input not in events:
                    break
                kind, payload = self.input.recv_multipart()
                self._handle(kind, payload)
                timeout = 0
            if not self.running:
                break
            if self._executor_failure is not None:
                raise self._executor_failure  # reported as DEAD, as a failed step
            if not ipc.parent_alive(self.parent_pid):
                logger.warning("the API server (pid %d) is gone; engine core exits", self.parent_pid)
                break
            if self.core.has_work():
                outputs = self.core.step()
                self._send(ipc.OUTPUTS, outputs)
                self._send_request_errors()
                self.last_stats = time.monotonic()
            elif time.monotonic() - self.last_stats > STATS_INTERVAL_S:
                self._send_stats()

    def _utility(self, call: dict[str, Any]) -> dict[str, Any]:
        """Run one utility call; its answer for ``UTILITY_RESULT``."""
        call_id, method = call.get("call_id"), call.get("method")
        if method not in UTILITY_METHODS:
            return {"call_id": call_id, "error": f"the engine core has no utility method {method!r}; it has "
                                                 f"{', '.join(sorted(UTILITY_METHODS))}", "kind": "ValueError"}
        try:
            result = getattr(self.core, method)(*call.get("args", ()), **call.get("kwargs", {}))
            ipc.encode(result)  # (a worker method's result must cross as plain data)
        except (ValueError, TypeError, RuntimeError, AttributeError) as exc:
            if method == "check_health":
                raise
            return {"call_id": call_id, "error": str(exc), "kind": type(exc).__name__}
        except Exception as exc:
            if method != "collective_rpc":
                raise
            return {"call_id": call_id, "error": f"{type(exc).__name__}: {exc}", "kind": "RuntimeError"}
        self._send_request_errors()  # (resume() may refuse a held request)
        self._send_stats()  # (a reset or a sleep changes the cache's usage: show it)
        return {"call_id": call_id, "result": result}

    def close(self) -> None:
        core = getattr(self, "core", None)
        if core is not None:
            core.shutdown()
        self.input.close(linger=0)
        self.output.close()
        self.ctx.term()


def run_engine_core(config_bytes: bytes, input_addr: str, output_addr: str, parent_pid: int,
                    ipc_dir: str, log_stats: bool = False) -> None:
    """Entry point of the spawned engine core process.

    Args:
        config_bytes: The engine configuration, msgpack.
        input_addr: Where requests come from (the API server binds it).
        output_addr: Where outputs go (the API server binds it).
        parent_pid: The API server's pid, watched to exit when it is gone.
        ipc_dir: The API server's IPC directory, for the worker sockets too.
        log_stats: Record each request's lifecycle events (queued, scheduled, preempted)
            for per-request statistics; off (``--disable-log-stats`` without stat-logger
            plugins), nothing is recorded.
    """
    from forkless.plugins import load_general_plugins

    # The collector is off while the engine core imports and builds what lives as long as
    # it (as in the API server, forkless.entrypoints.cli.main), then on and frozen.
    gc.disable()
    # SIGINT goes to the whole process group on Ctrl-C, and SIGTERM does on systemd's stop;
    # the API server orchestrates the shutdown, so the engine core waits to be told (or
    # for its parent to vanish; a SIGTERM while it runs is logged, not remembered).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ipc.leave_sigterm_to_parent(parent_pid)
    ipc.use_ipc_dir(ipc_dir)
    load_general_plugins()
    proc = None
    try:
        proc = EngineCoreProc(config_bytes, input_addr, output_addr, parent_pid, log_stats)
        gc.enable()
        tune_process()  # this process is forkless's alone (forkless.gc_tuning)
        proc.run()
    except SystemExit:
        pass
    except Exception as exc:
        if proc is None:  # failed to start: the API server got FAILED with the traceback and reports it
            logger.debug("engine core failed to start: %s", exc, exc_info=True)
        else:
            logger.error("engine core failed: %s", exc, exc_info=True)
        if proc is not None:
            try:
                proc._send(ipc.DEAD, {"error": f"{type(exc).__name__}: {exc}"})
                # Delivered before os._exit, which would kill ZeroMQ's I/O thread with the
                # message still queued: the API server would then see only an exit code,
                # not the reason. (The output socket's linger bounds the wait.)
                proc.input.close(linger=0)
                proc.output.close()
                proc.ctx.term()
            except Exception:  # the socket may be gone too
                pass
        ipc.remove_ipc_dir_if_orphaned(parent_pid, ipc_dir)
        os._exit(1)
    finally:
        if proc is not None:
            proc.close()
    # After close(): the workers have stopped, so nothing uses the directory any more.
    ipc.remove_ipc_dir_if_orphaned(parent_pid, ipc_dir)
    ipc.exit_process(0)


def start_engine_core_process(config_bytes: bytes, input_addr: str, output_addr: str,
                              ipc_dir: str, log_stats: bool = False) -> multiprocessing.process.BaseProcess:
    """Spawn the engine core process (see :func:`run_engine_core` for the arguments)."""
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=run_engine_core, name="forkless-engine-core",
                       args=(config_bytes, input_addr, output_addr, os.getpid(), ipc_dir, log_stats))
    proc.start()
    return proc


def _request_id(payload: bytes) -> str | None:
    """The ``request_id`` of an ``EngineCoreRequest`` message that failed its typed
    decoding (``None`` if even that is unreadable)."""
    try:
        data = ipc.decode(payload)
    except msgspec.DecodeError:
        return None
    request_id = data.get("request_id") if isinstance(data, dict) else None
    return request_id if isinstance(request_id, str) else None
