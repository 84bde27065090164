"""The wire format between forkless processes: ZeroMQ multipart frames of msgpack.

Every message is ``[kind, payload]``: ``kind`` is a short ASCII tag, ``payload`` is
msgpack (msgspec) of plain data. Nothing is pickled across a socket.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import msgspec

_encoder = msgspec.msgpack.Encoder()


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def decode(data: bytes, type: Any = Any) -> Any:  # noqa: A002 - msgspec's own name
    return msgspec.msgpack.decode(data, type=type)


def ipc_address(directory: str, name: str) -> str:
    return f"ipc://{os.path.join(directory, name)}"


def make_ipc_dir(prefix: str) -> str:
    """A private directory for this server's IPC sockets (removed at shutdown)."""
    return tempfile.mkdtemp(prefix=prefix)


def parent_alive(parent_pid: int) -> bool:
    """Whether the process that started us still runs (children exit when it dies)."""
    return os.getppid() == parent_pid


# Message kinds ----------------------------------------------------------------------
ADD = b"add"
ABORT = b"abort"
SHUTDOWN = b"shutdown"
READY = b"ready"
FAILED = b"failed"
OUTPUTS = b"outputs"
REQUEST_ERROR = b"request_error"
DEAD = b"dead"
