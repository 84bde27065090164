"""HTTP-level limits: how large and how slow a request may be, and who may send it.

Invariants:
    * A request body larger than ``--max-request-body-size`` is refused with 413 before
      the application parses it: at once when ``Content-Length`` says so, else as soon as
      the bytes read pass the limit (chunked bodies).
    * A client has ``--request-read-timeout`` seconds to send a request's head (the
      request line and headers), and again that long to send its whole body, counted from
      the end of the head. A slower head gets the connection closed; a slower body gets a
      408, or, when the application answered without reading it (an early 401 or 404),
      the connection closed. Neither keeps a connection (or the memory of a half-read
      body) for longer.
    * Every answer from this module has the OpenAI error body and closes the connection
      (``Connection: close``), because the rest of the request is never read. The close
      is graceful when the body is unread (a 413 on its ``Content-Length``, a 408, an
      early 401): the server half-closes and discards what still arrives, at most
      ``--max-request-body-size`` bytes for at most :data:`LINGER_SECONDS`, before it
      closes. Closing a socket with unread data makes the kernel reset the connection, and
      a client still sending its body would read ``ECONNRESET`` instead of the answer.
    * With an API key, every route needs ``Authorization: Bearer KEY``, compared in
      constant time, except :data:`OPEN_PATHS` (probes and Prometheus). Routes added by
      endpoint plugins and mounted apps are covered too: the check is ASGI middleware in
      front of the whole application, not a per-route dependency.

uvicorn has no timeout for a request head, nor for a body nobody reads (its keep-alive
timeout only runs between requests), so :func:`h11_protocol` adds one to its h11
protocol class; the server therefore always speaks h11, even when httptools is installed.
"""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import dataclass
from typing import Any

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from forkless import envs
from forkless.entrypoints.openai.errors import RequestBodyError, error_bytes
from forkless.logger import init_logger

logger = init_logger("forkless.entrypoints.openai")

# Reachable without the API key: liveness probes, the version, and Prometheus scrapes.
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics"})

DEFAULT_MAX_REQUEST_BODY_SIZE = 32 << 20
DEFAULT_REQUEST_READ_TIMEOUT = 30.0
DEFAULT_MAX_SEQUENCES_PER_REQUEST = 256
# How long a connection closed with its request body unread keeps discarding the body
# (nginx's lingering_time is 30 s; a client that means to read its answer has sent the
# rest of a 32 MiB body by then even at a few MB/s, and a slow one is cut off anyway).
LINGER_SECONDS = 5.0


@dataclass(frozen=True)
class HttpLimits:
    """The server's per-request limits.

    Attributes:
        max_request_body_size: Largest accepted request body, in bytes.
        request_read_timeout: Seconds a client has to send a request head, and again
            its body.
        max_sequences_per_request: Most sequences one request may ask for (prompts × n).
    """

    max_request_body_size: int = DEFAULT_MAX_REQUEST_BODY_SIZE
    request_read_timeout: float = DEFAULT_REQUEST_READ_TIMEOUT
    max_sequences_per_request: int = DEFAULT_MAX_SEQUENCES_PER_REQUEST

    def __post_init__(self) -> None:
        if self.max_request_body_size < 1:
            raise ValueError(f"--max-request-body-size {self.max_request_body_size}: expected bytes >= 1")
        if not self.request_read_timeout > 0:
            raise ValueError(f"--request-read-timeout {self.request_read_timeout}: expected seconds > 0")
        if self.max_sequences_per_request < 1:
            raise ValueError(f"--max-sequences-per-request {self.max_sequences_per_request}: expected >= 1")

    @classmethod
    def from_cli_args(cls, args: Any) -> "HttpLimits":
        """The limits given by ``forkless serve``'s flags (``None``: the default).

        Raises:
            ValueError: A limit is out of range.
        """
        given = {"max_request_body_size": args.max_request_body_size,
                 "request_read_timeout": args.request_read_timeout,
                 "max_sequences_per_request": args.max_sequences_per_request}
        return cls(**{name: value for name, value in given.items() if value is not None})

    def uvicorn_options(self) -> dict[str, Any]:
        """Keyword arguments for ``uvicorn.Config`` that enforce the connection limits."""
        return {"http": h11_protocol(self.request_read_timeout, self.max_request_body_size),
                "timeout_keep_alive": envs.FORKLESS_HTTP_TIMEOUT_KEEP_ALIVE}


class _H11ProtocolWithReadTimeout(H11Protocol):
    """uvicorn's h11 protocol, closing connections that send a request too slowly where
    no application deadline applies: the request head, and a body the application
    answered without reading (an early 401 or 404, which uvicorn then discards as it
    arrives).

    The timer starts with the connection, with the first byte of a later request on a
    kept-alive connection (until then uvicorn's keep-alive timeout applies), or when such
    an early response is complete. More bytes do not restart it: a client that sends a
    header line every few seconds is cut off all the same.
    """

    read_timeout: float = DEFAULT_REQUEST_READ_TIMEOUT
    linger_bytes: int = DEFAULT_MAX_REQUEST_BODY_SIZE
    _read_timer: asyncio.TimerHandle | None = None
    # Set while closing gracefully (see _LingeringClose): the timer that ends it.
    _linger_timer: asyncio.TimerHandle | None = None
    _linger_left = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw_transport = transport
        # uvicorn closes through the transport it was given (the protocol and each
        # request's cycle): this one decides whether that close lingers.
        super().connection_made(_LingeringClose(transport, self))  # type: ignore[arg-type]
        self._start_read_timer()

    def data_received(self, data: bytes) -> None:
        if self._linger_timer is not None:
            self._linger_left -= len(data)  # the unread body, discarded
            if self._linger_left < 0:
                self._raw_transport.close()
            return
        super().data_received(data)
        if self.conn.their_state is h11.IDLE or self._body_unread():
            self._start_read_timer()
        else:
            self._stop_read_timer()  # a whole head arrived: the application reads the body

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._body_unread():
            self._start_read_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_read_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self._linger_timer is not None:
            self._raw_transport.close()  # the server is stopping: it waits for no client's body
            return
        super().shutdown()

    def close_gracefully(self) -> bool:
        """Half-close instead of closing when the request body is still arriving.

        Returns:
            Whether the connection now lingers (else the caller closes it).
        """
        raw = self._raw_transport
        if (self._linger_timer is not None or raw.is_closing() or self.conn.their_state is not h11.SEND_BODY
                or not raw.can_write_eof()):
            return self._linger_timer is not None
        self._stop_read_timer()
        self._linger_left = self.linger_bytes
        self._linger_timer = self.loop.call_later(LINGER_SECONDS, raw.close)
        raw.write_eof()  # sends FIN once the answer is flushed
        raw.resume_reading()  # uvicorn may have paused it for a body nobody read
        return True

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers a request h11 cannot parse (a bad request line or header, an
        # unfinished head past h11's 16 KiB) in plain text; this is the same answer with
        # the OpenAI body.
        body = error_bytes(f"the request is not valid HTTP/1.1, or its head is too large ({msg.rstrip('.')})", 400)
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _body_unread(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY and self.cycle is not None and self.cycle.response_complete

    def _start_read_timer(self) -> None:
        if self._read_timer is None and not self.transport.is_closing():
            self._read_timer = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _stop_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if (self.conn.their_state is h11.IDLE or self._body_unread()) and not self.transport.is_closing():
            logger.info("closed a connection from %s: the request did not arrive within %g s "
                        "(--request-read-timeout)", self.client, self.read_timeout)
            self._raw_transport.close()  # too slow: no lingering


class _LingeringClose:
    """A transport whose ``close()`` half-closes while the request body is unread.

    uvicorn closes the transport right after an answer with ``Connection: close``; when
    the client is still sending its body, the kernel then resets the connection (data
    arrived that nobody will read) and the client, busy writing, never reads the answer.
    Here that close sends FIN after the answer and discards the rest of the body, bounded
    by ``--max-request-body-size`` bytes and :data:`LINGER_SECONDS`; the client reads its
    413 or 408. Everything else is the wrapped transport's.
    """

    def __init__(self, transport: asyncio.Transport, protocol: _H11ProtocolWithReadTimeout) -> None:
        self._transport = transport
        self._protocol = protocol

    def close(self) -> None:
        if not self._protocol.close_gracefully():
            self._transport.close()

    def is_closing(self) -> bool:
        # While lingering the connection is closed as far as uvicorn is concerned.
        return self._protocol._linger_timer is not None or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def h11_protocol(read_timeout: float, linger_bytes: int = DEFAULT_MAX_REQUEST_BODY_SIZE) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with the read timeout above (for ``uvicorn.Config(http=)``).

    Args:
        read_timeout: ``--request-read-timeout``.
        linger_bytes: Most bytes of an unread body discarded before closing
            (``--max-request-body-size``).
    """
    return type("H11ProtocolWithReadTimeout", (_H11ProtocolWithReadTimeout,),
                {"read_timeout": read_timeout, "linger_bytes": linger_bytes})


async def send_error(send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer with an OpenAI error body and close the connection afterwards."""
    body = error_bytes(message, status)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def _content_encoding(scope: Scope) -> str | None:
    """The request's ``Content-Encoding`` other than ``identity``, else ``None``."""
    for name, value in scope["headers"]:
        if name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            return value.decode("latin-1")
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # h11 refuses a malformed Content-Length before we get here
    return None


class RequestLimitsMiddleware:
    """ASGI middleware enforcing the body size and body read timeout (see the module).

    Args:
        app: The application.
        limits: The limits.
    """

    def __init__(self, app: ASGIApp, limits: HttpLimits) -> None:
        self.app = app
        self.max_size = limits.max_request_body_size
        self.timeout = limits.request_read_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > self.max_size:
            await send_error(send, 413, self._too_large(length))
            return
        encoding = _content_encoding(scope)
        if encoding is not None:
            # Nothing here decompresses a body (a small gzip body could also expand past
            # the size limit): say so, rather than fail to read it as JSON.
            await send_error(send, 415, f"Content-Encoding {encoding[:50]!r} is not supported: send the body "
                                        "uncompressed", [(b"accept-encoding", b"identity")])
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        received = 0
        body_done = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, body_done
            if body_done:
                return await receive()  # e.g. waiting for http.disconnect: no deadline
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                logger.info("request %s %s: the body did not arrive within %.0f s (%d bytes read); answering 408",
                            scope["method"], scope["path"], self.timeout, received)
                raise RequestBodyError(408, f"the request body did not arrive within {self.timeout:g} s "
                                            "(--request-read-timeout)") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_size:
                    raise RequestBodyError(413, self._too_large(received))
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except RequestBodyError as exc:
            # Normally answered by the application's HTTPException handler; this covers
            # code that reads the body outside of it (middleware, a mounted app).
            if started:
                raise
            await send_error(send, exc.status_code, exc.detail)

    def _too_large(self, size: int) -> str:
        return (f"the request body is larger than this server accepts: {size} bytes, the limit is "
                f"{self.max_size} (--max-request-body-size)")


def _route_path(scope: Scope) -> str:
    """The path the routes see: under ``--root-path`` uvicorn puts the prefix in front."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class ApiKeyMiddleware:
    """ASGI middleware requiring ``Authorization: Bearer KEY`` outside :data:`OPEN_PATHS`.

    Args:
        app: The application.
        api_key: The key.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or _route_path(scope) in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
        else:
            await send_error(send, 401, "invalid or missing API key (send Authorization: Bearer <key>)",
                             [(b"www-authenticate", b"Bearer")])

    def _authorized(self, scope: Scope) -> bool:
        value = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, token = value.strip().partition(b" ")
        # compare_digest takes as long whatever the token, so timing does not reveal how
        # much of the key a guess got right.
        return hmac.compare_digest(token.strip(), self.key) and scheme.lower() == b"bearer"
