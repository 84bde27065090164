"""The wire format between forkless processes: ZeroMQ multipart frames of msgpack.

Every message is ``[kind, payload]``: ``kind`` is a short ASCII tag, ``payload`` is
msgpack (msgspec) of plain data. Nothing is pickled across a socket.

IPC directories. The sockets live in private (0700) directories under the temp directory
(``$TMPDIR``), named ``forkless-*``. Invariants:

    * One server has one: the API server makes it (:func:`make_ipc_dir`) and hands it
      to the engine core, which declares it its IPC directory (:func:`use_ipc_dir`); the
      engine core's executor then puts the worker sockets in it instead of making
      another. The offline engine, whose executor runs in the caller's process, has the
      executor's own.
    * The process that made a directory removes it when it shuts down, also after one of
      its children died.
    * A child whose parent is gone (killed: it never shut down) removes the directory
      it was given before it exits (:func:`remove_ipc_dir_if_orphaned`). So a SIGKILL of
      any one process of a server leaves no ``forkless-*`` directory behind.
    * An owner of child processes that is dropped, or that the interpreter leaves,
      without a shutdown stops them then (:func:`release_with`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import weakref
from typing import Any, Callable, NoReturn

import msgspec

from forkless.logger import init_logger

logger = init_logger("forkless.protocol.ipc")
_encoder = msgspec.msgpack.Encoder()


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def decode(data: bytes, type: Any = Any) -> Any:  # noqa: A002 - msgspec's own name
    return msgspec.msgpack.decode(data, type=type)


def ipc_address(directory: str, name: str) -> str:
    return f"ipc://{os.path.join(directory, name)}"


def connect_to_parent(addr_in: str, addr_out: str) -> tuple[Any, Any, Any]:
    """A child process's two sockets to the parent that bound ``addr_in`` (PUSH, where
    calls come from) and ``addr_out`` (PULL, where replies go): ``(context, inbox,
    outbox)``; the outbox lingers a second at close, so that a last reply still leaves."""
    import zmq

    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.connect(addr_in)
    outbox = ctx.socket(zmq.PUSH)
    outbox.setsockopt(zmq.LINGER, 1000)
    outbox.connect(addr_out)
    return ctx, inbox, outbox


def push_to_peers(ctx: Any, sockets: dict[str, Any], addresses: list[str], frames: list[bytes]) -> None:
    """Send ``frames`` to each address without blocking, on a PUSH socket per address
    connected at first use and kept in ``sockets`` (the caller closes them). A peer that
    is gone is skipped: what waited for it (its step, its fill) fails on its own."""
    import zmq

    for address in addresses:
        sock = sockets.get(address)
        if sock is None:
            sock = sockets[address] = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            continue  # the peer is gone (see above)


def release_with(owner: Any, release: Callable[..., None], *args: Any) -> weakref.finalize:
    """Call ``release(*args)`` once: when ``owner`` is garbage collected, when the
    interpreter exits, or when the returned finalizer is called (the owner's
    ``shutdown``), whichever comes first. ``release`` and ``args`` must not refer to
    ``owner`` (they would keep it alive).

    Owners of non-daemon child processes need this: a script that drops its engine or
    exits without a shutdown (an uncaught exception, Ctrl-C) would otherwise leave
    children that wait for a shutdown message, and ``multiprocessing``'s exit handler
    joins such children forever. The exit call is registered here, after that handler
    (``multiprocessing`` is imported first), so it runs before it; ``weakref.finalize``'s
    own exit hook may have been registered earlier, so it is not relied on.
    """
    finalizer = weakref.finalize(owner, release, *args)
    finalizer.atexit = False
    atexit.register(finalizer)
    return finalizer


def stop_process(proc: Any, timeout: float) -> bool:
    """Wait up to ``timeout`` s for a ``multiprocessing`` child that was told to stop, then
    terminate it (5 s), then kill it (5 s). Returns whether it stopped by itself."""
    proc.join(timeout)
    if not proc.is_alive():
        return True
    proc.terminate()
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
    return False


def make_ipc_dir(prefix: str) -> str:
    """A new private directory for IPC sockets, in the temp directory (its maker removes
    it at shutdown)."""
    return tempfile.mkdtemp(prefix=prefix)


# This process's IPC directory when its parent made it (see use_ipc_dir).
_inherited_dir: str | None = None


def use_ipc_dir(directory: str) -> None:
    """Declare the IPC directory this process got from its parent: sockets this process
    binds go in it too (see :func:`inherited_ipc_dir`)."""
    global _inherited_dir
    _inherited_dir = directory


def inherited_ipc_dir() -> str | None:
    """The IPC directory this process got from its parent, or ``None`` (it makes its own)."""
    return _inherited_dir


def remove_ipc_dir(directory: str) -> None:
    """Remove an IPC directory and the socket files in it (no error if it is gone)."""
    shutil.rmtree(directory, ignore_errors=True)


def parent_alive(parent_pid: int) -> bool:
    """Whether the process that started us still runs (children exit when it dies)."""
    return os.getppid() == parent_pid


def leave_sigterm_to_parent(parent_pid: int) -> None:
    """Install this child's SIGTERM handler: while its parent runs, a SIGTERM is logged and
    left to the parent; once the parent is gone, one ends the process.

    A signal sent to the whole process group (systemd's default stop, ``timeout``,
    ``kill -- -PGID``) reaches the engine core and the workers too; exiting at once would
    fail the requests the API server is draining (``--shutdown-timeout``) and make it
    report a dead engine. The parent got the same signal and stops its children when it
    is done (a second signal to it cuts the drain short); a child whose parent is gone
    exits anyway (its watch of the parent).

    A child cannot tell that signal from one sent to it alone (a stray ``kill``), so it
    remembers none: a stray SIGTERM is logged and forgotten, and a later stop of the whole
    group still drains. (Remembering the first, so that a second one ended the child,
    made every group stop after a stray signal end the child at once, mid-drain.)
    """
    import multiprocessing
    import signal

    def on_sigterm(*_: Any) -> None:
        if not parent_alive(parent_pid):
            raise SystemExit(0)
        # (A handler runs on the main thread between bytecodes; logging's locks are
        # reentrant, so a signal that lands inside a log call cannot deadlock it.)
        logger.info("%s got SIGTERM while its parent (pid %d) runs: left to the parent, which stops this "
                    "process when it shuts down (a stop of the whole server reaches the parent too)",
                    multiprocessing.current_process().name, parent_pid)

    signal.signal(signal.SIGTERM, on_sigterm)


def exit_process(code: int = 0) -> NoReturn:
    """End this process now, once its own shutdown is done, as the interpreter would but for
    its teardown: threads that are not daemons are waited for, the ``atexit``
    handlers run (``weakref.finalize`` and ``multiprocessing``'s included), logging and
    the standard streams are flushed; the teardown is skipped.

    That teardown (each module's globals dropped, the collector over everything torch,
    transformers and xgrammar built) took ~0.7 s of a 2-core host per process, and each
    parent waits for its children's exits one after the other: a server's stop, an
    offline engine's ``shutdown()``.
    """
    import logging
    import sys
    import threading

    try:
        # What the interpreter's exit calls first (multiprocessing's children call it too):
        # the hooks that stop thread pools' workers, then a join of every thread that is
        # not a daemon.
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    finally:
        os._exit(code)


def remove_ipc_dir_if_orphaned(parent_pid: int, directory: str) -> bool:
    """Remove ``directory`` when the parent is gone: it was killed, and cannot.

    Returns:
        Whether the parent was gone.
    """
    if parent_alive(parent_pid):
        return False
    remove_ipc_dir(directory)
    return True


class ChildStartError(RuntimeError):
    """A child process (a worker, the engine core) answered FAILED while starting.

    The message is one line (``worker 0 failed to start: TypeError: ...``); the child's
    traceback, the one that shows the cause, travels beside it, so that it is printed
    once, where the failure is reported, not again inside every parent's message.

    Args:
        message: What failed.
        child_traceback: The child's formatted traceback.
    """

    def __init__(self, message: str, child_traceback: str = "") -> None:
        super().__init__(message)
        self.child_traceback = child_traceback
        if child_traceback:  # shown where Python prints the exception (an offline script's crash)
            self.add_note(f"the child's traceback:\n{child_traceback.rstrip()}")


# Message kinds ----------------------------------------------------------------------
ADD = b"add"
ABORT = b"abort"
SHUTDOWN = b"shutdown"
READY = b"ready"
FAILED = b"failed"
OUTPUTS = b"outputs"
REQUEST_ERROR = b"request_error"
DEAD = b"dead"
# A call of one of the engine core's methods between steps (AsyncLLM.reset_prefix_cache,
# sleep, wake_up, pause_generation, ...: core_proc.UTILITY_METHODS):
# {"call_id", "method", "args", "kwargs"}; answered with
# UTILITY_RESULT {"call_id", "result"} or {"call_id", "error", "kind"}.
UTILITY = b"utility"
UTILITY_RESULT = b"utility_result"
