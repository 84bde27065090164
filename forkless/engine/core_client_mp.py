"""The API server's side of the engine core: a spawned process behind two ZeroMQ sockets.

The client makes the server's IPC directory (``forkless.protocol.ipc``): its own two
sockets, and the engine core's worker sockets, live there. It removes the directory at
shutdown, whether the engine core stopped when told or died.

Sends never wait for a dead engine core: a ZeroMQ PUSH socket whose peer is gone would
hold a send forever, so each send is tried without blocking and, while the socket cannot
take it, retried every ``SEND_POLL_MS`` as long as the engine core process lives.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from forkless.protocol import ipc
from forkless.engine.core_proc import start_engine_core_process
from forkless.logger import init_logger

if TYPE_CHECKING:
    from forkless.config import EngineConfig
    from forkless.protocol.engine import EngineCoreRequest

logger = init_logger("forkless.engine.client")

# How often a send that the socket cannot take yet checks that the engine core still lives.
SEND_POLL_MS = 50


class EngineDeadError(RuntimeError):
    """The engine core (or one of its workers) died; no request can be served."""


def _stop_engine_core(proc: Any, input_sock: zmq.asyncio.Socket, output_sock: zmq.asyncio.Socket,
                      ctx: zmq.asyncio.Context, ipc_dir: str, timeout: float = 10.0) -> None:
    """Tell the engine core process to stop, wait ``timeout`` s, then terminate and kill
    it; close the sockets and remove the IPC directory."""
    if proc.is_alive():
        try:
            # Through a plain shadow of the socket: the asyncio one needs an event loop,
            # and none runs after asyncio.run() returned, or at exit.
            zmq.Socket.shadow(input_sock.underlying).send_multipart([ipc.SHUTDOWN, b"\xc0"], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
    if not ipc.stop_process(proc, timeout):
        logger.warning("engine core did not stop within %.0f s; terminated it", timeout)
    input_sock.close(linger=0)
    output_sock.close(linger=0)
    ctx.term()
    ipc.remove_ipc_dir(ipc_dir)


class EngineCoreClient:
    """Starts the engine core process and talks to it asynchronously.

    Args:
        config: The engine configuration, sent to the process as msgpack.
        log_stats: Have the engine core record each request's lifecycle events (queued,
            scheduled, preempted) for per-request statistics, as vLLM's ``log_stats``.
    """

    def __init__(self, config: "EngineConfig", log_stats: bool = False) -> None:
        self.ipc_dir = ipc.make_ipc_dir("forkless-ipc-")
        self.ctx = zmq.asyncio.Context()
        self.input = self.ctx.socket(zmq.PUSH)
        self.input.bind(ipc.ipc_address(self.ipc_dir, "input"))
        self.output = self.ctx.socket(zmq.PULL)
        self.output.bind(ipc.ipc_address(self.ipc_dir, "output"))
        # The same socket, read without the event loop: see next_queued_message().
        self._output_now = zmq.Socket.shadow(self.output.underlying)
        self.proc = start_engine_core_process(
            ipc.encode(config.to_builtins()), ipc.ipc_address(self.ipc_dir, "input"),
            ipc.ipc_address(self.ipc_dir, "output"), self.ipc_dir, log_stats)
        logger.info("started the engine core process (pid %d); it starts the worker, which loads the model",
                    self.proc.pid)
        self.ready_info: dict[str, Any] = {}
        self.closed = False
        # Stops the engine core at shutdown, or when this client is dropped or the
        # interpreter exits without one (it is no daemon: it has worker processes).
        self._release = ipc.release_with(self, _stop_engine_core, self.proc, self.input, self.output, self.ctx,
                                         self.ipc_dir)

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    async def wait_ready(self, timeout: float = 600.0) -> dict[str, Any]:
        """Wait for the engine core to load the model and size the KV cache.

        Raises:
            RuntimeError: It failed to start (its error is in the message) or died.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if await self.output.poll(200):
                kind, payload = await self.output.recv_multipart()
                data = ipc.decode(payload)
                if kind == ipc.READY:
                    self.ready_info = data
                    return data
                if kind == ipc.FAILED:
                    raise RuntimeError(f"the engine core failed to start: {data['error']}\n{data['traceback']}")
            if not self.proc.is_alive():
                raise RuntimeError(f"the engine core process exited with code {self.proc.exitcode} "
                                   "while starting (see its log above)")
        raise RuntimeError(f"the engine core did not start within {timeout:.0f} s")

    async def _send(self, frames: list[bytes]) -> bool:
        """Send ``frames`` to the engine core; False, at once, when its process is gone (a
        PUSH socket without its peer would wait forever)."""
        while True:
            try:
                await self.input.send_multipart(frames, flags=zmq.NOBLOCK)
                return True
            except zmq.Again:
                if not self.proc.is_alive():
                    return False
                await self.input.poll(SEND_POLL_MS, zmq.POLLOUT)

    async def add_request(self, request: "EngineCoreRequest | bytes") -> None:
        """Send a request (or its msgpack encoding) to the engine core.

        Raises:
            EngineDeadError: The engine core process is gone.
        """
        payload = request if isinstance(request, bytes) else ipc.encode(request)
        if not await self._send([ipc.ADD, payload]):
            raise EngineDeadError(f"the engine died: the engine core process exited with code {self.proc.exitcode}")

    async def call_utility(self, call: dict[str, Any]) -> None:
        """Send a utility call (:data:`forkless.protocol.ipc.UTILITY`) to the engine core.

        Raises:
            EngineDeadError: The engine core process is gone.
        """
        if not await self._send([ipc.UTILITY, ipc.encode(call)]):
            raise EngineDeadError(f"the engine died: the engine core process exited with code {self.proc.exitcode}")

    async def abort_requests(self, request_ids: list[str]) -> None:
        """Abort requests in the engine core (nothing to abort once it is gone)."""
        if request_ids and not self.closed:
            await self._send([ipc.ABORT, ipc.encode(request_ids)])

    async def get_message(self, timeout_ms: int = 500) -> tuple[bytes, bytes] | None:
        """The next message from the engine core, or ``None`` after ``timeout_ms``."""
        if await self.output.poll(timeout_ms):
            kind, payload = await self.output.recv_multipart()
            return kind, payload
        return None

    def next_queued_message(self) -> tuple[bytes, bytes] | None:
        """The next message from the engine core if one is already queued, else ``None``
        (never waits, never yields to the event loop)."""
        try:
            kind, payload = self._output_now.recv_multipart(flags=zmq.NOBLOCK)
        except zmq.Again:
            return None
        return kind, payload

    def is_alive(self) -> bool:
        return self.proc.is_alive()

    def shutdown(self) -> None:
        """Stop the engine core (and, through it, the workers); never leaves orphans."""
        self.closed = True
        self._release()
