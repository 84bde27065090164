"""The disaggregated-prefill proxy served by ``forkless disagg-proxy``.

A client talks to this proxy as to one OpenAI-compatible server. Each generation request
runs in two steps: a prefill server (``--kv-transfer-config`` role ``kv_producer``)
computes the prompt and leaves its KV cache in the connector's store, then a decode server
(``kv_consumer``) generates the answer, loading that KV instead of recomputing it. The
proxy itself knows nothing of KV caches; it only orders the two calls.

Invariants:
    * A generation request goes to a prefill server first, as a copy cut to one token
      (``max_tokens=1``, and ``max_completion_tokens=1`` when the client used it; ``n=1``;
      no stream, no ``stream_options``, no ``min_tokens``), and to a decode server only
      once that call succeeded. The decode server gets the client's body byte for byte,
      unless the prefill server answered ``kv_transfer_params``: then the body with those
      added (vLLM's hand-over for connectors that pair the two requests).
    * The client sees the decode server's answer unchanged: its status and JSON, or its
      SSE stream relayed event by event as the events arrive. A backend's own error (any non-200, from either
      step) comes back unchanged too, and a prefill error stops the request before the
      decode server is called. A backend that cannot be reached becomes a 502 (504 on a
      connect timeout) whose OpenAI-style message names the role and the URL.
    * A client that goes away cancels what runs for it: the call in flight is cancelled
      and a stream's upstream connection closed, which the decode server takes as an
      abort. Nothing is left generating for nobody.
    * One ``httpx.AsyncClient`` (one connection pool) serves every request for the life of
      the app. Connecting is bounded; reading is not (a long generation streams for
      minutes, and a non-streamed one is silent until it ends).
    * Several servers per role are used in turn (round-robin), per role independently.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid
from typing import Any, AsyncIterator, Awaitable, Iterable
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request

from forkless.entrypoints.openai.errors import error_body, error_response, quoted
from forkless.logger import init_logger

logger = init_logger("forkless.disagg_proxy")

#: Seconds to open a connection to a backend (there is no read timeout).
CONNECT_TIMEOUT_S = 10.0
#: Seconds a backend's ``/health`` has to answer the proxy's ``/health``.
HEALTH_TIMEOUT_S = 5.0
#: Largest request body read (forkless serve's default limit: a larger one fails there anyway).
DEFAULT_MAX_BODY_BYTES = 32 << 20
#: The routes that run prefill then decode.
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
#: Request headers passed on to the backends (anything else is the proxy's own business).
_FORWARDED_REQUEST_HEADERS = ("authorization", "x-request-id")
#: Backend response headers passed back to the client.
_FORWARDED_RESPONSE_HEADERS = ("retry-after", "www-authenticate", "x-request-id")
#: Fields of the client's request that make no sense for the one-token prefill call.
_DROPPED_FOR_PREFILL = ("stream_options", "min_tokens", "best_of")


def check_backend_url(value: str) -> str:
    """A backend's base URL, normalized (no trailing slash).

    Raises:
        ValueError: ``value`` is not ``http(s)://HOST[:PORT]``; the message quotes it.
    """
    expected = f"expected http://HOST:PORT or https://HOST:PORT (no path), got {value!r}"
    try:
        parts = urlsplit(value.strip())
        _ = parts.port  # raises ValueError on a port that is not a number in range
    except ValueError:
        raise ValueError(expected) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(expected)
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(expected)
    return f"{parts.scheme}://{parts.netloc}"


class _Backends:
    """The servers of one role, used in turn.

    Args:
        role: ``"prefill"`` or ``"decode"`` (named in errors).
        urls: Base URLs, already checked by ``check_backend_url``.
    """

    def __init__(self, role: str, urls: Iterable[str]) -> None:
        self.role = role
        self.urls = list(urls)
        if not self.urls:
            raise ValueError(f"no {role} server given")
        self._turn = itertools.cycle(self.urls)

    def next(self) -> str:
        return next(self._turn)


class _Unreachable(Exception):
    """A backend could not be asked (refused, reset, timed out); becomes a 502 or 504."""

    def __init__(self, role: str, url: str, exc: httpx.HTTPError) -> None:
        self.status = 504 if isinstance(exc, httpx.TimeoutException) else 502
        what = "did not answer in time" if self.status == 504 else "could not be reached"
        super().__init__(f"the {role} server at {url} {what}: {type(exc).__name__}: {exc}".rstrip(": "))

    def response(self) -> JSONResponse:
        return error_response(str(self), self.status)


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The body sent to the prefill server: the client's, cut to one token, not streamed."""
    out = {k: v for k, v in body.items() if k not in _DROPPED_FOR_PREFILL}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out["n"] = 1
    return out


def _passthrough(resp: httpx.Response) -> Response:
    """A backend's whole (already read) answer, as the client's."""
    headers = {k: resp.headers[k] for k in _FORWARDED_RESPONSE_HEADERS if k in resp.headers}
    return Response(resp.content, status_code=resp.status_code, headers=headers,
                    media_type=resp.headers.get("content-type"))


def _kv_transfer_params(resp: httpx.Response) -> Any:
    """``kv_transfer_params`` of a prefill answer, or None (not JSON, or not there)."""
    try:
        answer = resp.json()
    except ValueError:
        return None
    return answer.get("kv_transfer_params") if isinstance(answer, dict) else None


def _event_end(data: bytes | bytearray) -> int:
    """Where the last complete SSE event of ``data`` ends (0: none is complete)."""
    ends = [at + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if (at := data.rfind(sep)) >= 0]
    return max(ends, default=0)


async def _relay(resp: httpx.Response, role: str, url: str) -> AsyncIterator[bytes]:
    """The upstream SSE stream, whole events as they arrive.

    An event split across reads is held back until its end arrives, so that an upstream
    failure mid-stream never leaves a half event before the SSE error event (and
    ``[DONE]``) that ends the stream then, as forkless serve ends its own failed streams.
    """
    pending = bytearray()
    try:
        async for chunk in resp.aiter_bytes():
            pending += chunk
            end = _event_end(pending)
            if end:
                yield bytes(pending[:end])
                del pending[:end]
        if pending:  # a last event without its blank line: the client decides
            yield bytes(pending)
    except httpx.HTTPError as exc:
        message = f"the {role} server at {url} broke off the stream: {type(exc).__name__}: {exc}"
        logger.warning("%s (%d bytes of a half-sent event dropped)", message, len(pending))
        yield b"data: " + json.dumps(error_body(message, 502)).encode() + b"\n\ndata: [DONE]\n\n"
    finally:
        await resp.aclose()


async def _unless_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """Await ``work``, cancelling it if the client hangs up first (its upstream call is
    then dropped, which the backend takes as an abort). The body must be read already."""
    task = asyncio.ensure_future(work)

    async def hang_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(hang_up())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return Response(status_code=499)  # nobody reads it; uvicorn only logs it


async def _read_json_object(request: Request, limit: int) -> dict[str, Any] | Response:
    """The request body as a JSON object, or the 4xx answer that refuses it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return error_response(f"the request body is {declared} bytes; the limit is {limit}", 413)
    raw = bytearray()
    try:
        async for piece in request.stream():
            raw += piece
            if len(raw) > limit:
                return error_response(f"the request body is over the limit of {limit} bytes", 413)
    except ClientDisconnect:
        return Response(status_code=499)  # gone before its body arrived: nobody to answer
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return error_response(f"the request body is not valid JSON: {quoted(str(exc))}", 400)
    if not isinstance(body, dict):
        return error_response(f"the request body must be a JSON object, got {type(body).__name__}", 400)
    request.state.raw_body = bytes(raw)
    return body


def build_proxy_app(prefill_urls: Iterable[str], decode_urls: Iterable[str], *,
                    connect_timeout: float = CONNECT_TIMEOUT_S,
                    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The proxy's ASGI app.

    Args:
        prefill_urls: Base URLs of the prefill servers (``http://host:port``).
        decode_urls: Base URLs of the decode servers.
        connect_timeout: Seconds to open a connection to a backend.
        max_body_bytes: Largest request body accepted (413 above).

    Raises:
        ValueError: A URL is malformed (the message quotes it) or a role has none.
    """
    prefill = _Backends("prefill", [check_backend_url(u) for u in prefill_urls])
    decode = _Backends("decode", [check_backend_url(u) for u in decode_urls])

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # trust_env=False: an HTTP(S)_PROXY meant for the internet must not capture the
        # calls to the backends; max_connections=None: the backends queue, not the proxy.
        async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=connect_timeout),
                                     limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                                     trust_env=False) as client:
            app.state.client = client
            yield

    app = FastAPI(title="forkless disagg-proxy", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        path = quoted(request.url.path)
        if exc.status_code == 404:
            message = f"Not Found: the proxy has no route {request.method} {path}"
        elif exc.status_code == 405:
            message = f"Method Not Allowed: {request.method} {path}"
        else:
            message = str(exc.detail)
        return error_response(message, exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the traceback after this answer; the client gets an OpenAI error.
        return error_response(f"internal error in the proxy: {type(exc).__name__}: {exc}", 500)

    def upstream_headers(request: Request) -> dict[str, str]:
        headers = {k: request.headers[k] for k in _FORWARDED_REQUEST_HEADERS if k in request.headers}
        # One id for both calls, so that the two servers' logs can be matched up.
        headers.setdefault("x-request-id", f"disagg-{uuid.uuid4().hex}")
        headers["content-type"] = "application/json"
        return headers

    async def prefill_then_decode(request: Request, path: str, body: dict[str, Any]) -> Response:
        client: httpx.AsyncClient = request.app.state.client
        headers = upstream_headers(request)
        url = prefill.next()
        try:
            resp = await client.post(url + path, content=json.dumps(prefill_request(body)), headers=headers)
        except httpx.HTTPError as exc:
            raise _Unreachable("prefill", url, exc) from exc
        if resp.status_code != 200:
            return _passthrough(resp)
        params = _kv_transfer_params(resp)
        content = request.state.raw_body if params is None else json.dumps({**body, "kv_transfer_params": params})
        url = decode.next()
        upstream = client.build_request("POST", url + path, content=content, headers=headers)
        streamed = body.get("stream") is True
        try:
            resp = await client.send(upstream, stream=streamed)
        except httpx.HTTPError as exc:
            raise _Unreachable("decode", url, exc) from exc
        if not streamed:
            return _passthrough(resp)
        if resp.status_code != 200:
            try:
                await resp.aread()
            except httpx.HTTPError as exc:
                raise _Unreachable("decode", url, exc) from exc
            finally:
                await resp.aclose()
            return _passthrough(resp)
        headers = {k: resp.headers[k] for k in _FORWARDED_RESPONSE_HEADERS if k in resp.headers}
        # The relay closes the upstream response when it ends or is cancelled; the
        # background task closes it too when the client left while a chunk was being sent
        # (the relay then never resumes). Closing twice is harmless.
        return StreamingResponse(_relay(resp, "decode", url), media_type="text/event-stream",
                                 headers=headers, background=BackgroundTask(resp.aclose))

    async def generation(request: Request) -> Response:
        body = await _read_json_object(request, max_body_bytes)
        if isinstance(body, Response):
            return body
        try:
            return await _unless_disconnected(request, prefill_then_decode(request, request.url.path, body))
        except _Unreachable as exc:
            logger.warning("%s", exc)
            return exc.response()

    for path in GENERATION_PATHS:
        app.add_api_route(path, generation, methods=["POST"])

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        url = decode.urls[0]
        try:
            resp = await request.app.state.client.get(url + "/v1/models", headers=upstream_headers(request))
        except httpx.HTTPError as exc:
            return _Unreachable("decode", url, exc).response()
        return _passthrough(resp)

    async def health_problem(client: httpx.AsyncClient, role: str, url: str) -> str | None:
        try:
            resp = await client.get(url + "/health", timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError as exc:
            return str(_Unreachable(role, url, exc))
        return None if resp.status_code == 200 else f"the {role} server at {url} answered {resp.status_code}"

    @app.get("/health")
    async def health(request: Request) -> Response:
        checks = [health_problem(request.app.state.client, b.role, url)
                  for b in (prefill, decode) for url in b.urls]
        problems = [p for p in await asyncio.gather(*checks) if p]
        if problems:
            return error_response("; ".join(problems), 503)
        return Response(status_code=200)

    return app
