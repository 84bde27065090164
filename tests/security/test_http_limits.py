"""HTTP limits and the API key (issue "Nobody can take the server down or stall everyone
else"): every route but /health, /version and /metrics needs the key, endpoint plugins'
routes and the docs included; bodies are size-limited; slow heads and bodies are cut off;
one request asks for a bounded number of sequences.

One server for the module: the key from FORKLESS_API_KEY, the example endpoint plugin
enabled, and small limits so that the tests are fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from forkless.entrypoints.openai import http_limits
from tests.server.conftest import Server, free_port, start_server, stop_and_check

KEY = "h9-env-key-7c41f0"
AUTH = {"Authorization": f"Bearer {KEY}"}
READ_TIMEOUT = 2.0
MAX_BODY = 200_000
MAX_SEQUENCES = 4


@pytest.fixture(scope="module")
def srv(tiny_llama: Path, plugin_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tiny_llama, tmp_path_factory.mktemp("security-limits"), "--served-model-name", "tiny",
                     "--request-read-timeout", str(READ_TIMEOUT), "--max-request-body-size", str(MAX_BODY),
                     "--max-sequences-per-request", str(MAX_SEQUENCES), site=plugin_site,
                     env_extra={"FORKLESS_API_KEY": KEY, "FORKLESS_PLUGINS": "example_hello"})
    s.api_key = KEY  # for srv.client()
    yield s
    assert stop_and_check(s) == 0, s.log()[-3000:]


def assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status, error
    return error


# -- 3. the API key -------------------------------------------------------------------

ROUTES = [("GET", "/v1/models", None), ("POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1}),
          ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
          ("POST", "/tokenize", {"prompt": "hi"}), ("POST", "/detokenize", {"tokens": [1]}),
          ("GET", "/docs", None), ("GET", "/redoc", None), ("GET", "/openapi.json", None),
          ("GET", "/example/hello", None)]  # the last one from the endpoint plugin


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                                     {"Authorization": f"Basic {KEY}"}, {"Authorization": f"Bearer {KEY}x"}])
def test_every_route_needs_the_key(srv: Server, headers: dict) -> None:
    for method, path, body in [*ROUTES, ("GET", "/no/such/route", None)]:
        resp = httpx.request(method, srv.url + path, json=body, headers=headers, timeout=60)
        error = assert_openai_error(resp, 401)
        assert error["type"] == "AuthenticationError" and "API key" in error["message"], (path, error)


def test_with_the_key_every_route_answers(srv: Server) -> None:
    for method, path, body in ROUTES:
        resp = httpx.request(method, srv.url + path, json=body, headers=AUTH, timeout=60)
        assert resp.status_code == 200, (path, resp.text[:300])
    assert httpx.get(srv.url + "/example/hello", headers=AUTH).json() == {"hello": "from forkless-example-endpoint"}


def test_probes_need_no_key(srv: Server) -> None:
    for path in ("/health", "/version", "/metrics"):
        assert httpx.get(srv.url + path, timeout=30).status_code == 200, path


def test_key_from_the_environment_works_and_is_not_logged(srv: Server) -> None:
    assert [m.id for m in srv.client().models.list().data] == ["tiny"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert KEY not in srv.log()


def test_the_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared = []

    def compare(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return a == b

    monkeypatch.setattr(http_limits.hmac, "compare_digest", compare)
    sent: list[dict] = []

    async def app(scope: dict, receive: object, send: object) -> None:
        sent.append({"type": "app"})

    async def send(message: dict) -> None:
        sent.append(message)

    middleware = http_limits.ApiKeyMiddleware(app, "k3y")
    for value, allowed in [(b"Bearer k3y", True), (b"bearer k3y", True), (b"Bearer k3", False), (b"", False)]:
        sent.clear()
        scope = {"type": "http", "path": "/v1/models", "headers": [(b"authorization", value)]}
        asyncio.run(middleware(scope, None, send))
        assert (sent[0]["type"] == "app") == allowed, value
    assert compared and all(b == b"k3y" for _, b in compared)


# -- 4. body size, read timeouts, sequences per request ---------------------------------

def raw_exchange(srv: Server, payload: bytes, wait: float = 20) -> tuple[float, bytes]:
    """Send ``payload`` and stall; (seconds until the server closed, what it answered)."""
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        sock.settimeout(wait)
        start = time.monotonic()
        sock.sendall(payload)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except socket.timeout:
            pytest.fail(f"the server kept the connection open for {wait} s; it answered {data[:200]!r}")
        except ConnectionResetError:
            pass
        return time.monotonic() - start, data


def head(path: str, extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\n").encode() + extra


def test_half_sent_body_gets_408_within_the_timeout(srv: Server) -> None:
    seconds, answer = raw_exchange(srv, head("/v1/completions", b"Content-Length: 100\r\n\r\n") + b'{"model": ')
    assert READ_TIMEOUT - 0.5 < seconds < READ_TIMEOUT + 3, seconds
    assert answer.startswith(b"HTTP/1.1 408") and b"connection: close" in answer.lower(), answer
    assert b'"type":"RequestTimeoutError"' in answer and b"--request-read-timeout" in answer, answer


@pytest.mark.parametrize("payload", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"],
                         ids=["nothing", "half-head"])
def test_slow_head_is_closed_within_the_timeout(srv: Server, payload: bytes) -> None:
    seconds, answer = raw_exchange(srv, payload)
    assert seconds < READ_TIMEOUT + 3 and answer == b"", (seconds, answer)


def test_head_sent_a_line_at_a_time_is_cut_off(srv: Server) -> None:
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        with pytest.raises((BrokenPipeError, ConnectionResetError)):  # once the server closed it
            for i in range(40):
                time.sleep(0.25)
                sock.sendall(b"X-Slow-%d: 1\r\n" % i)
        assert time.monotonic() - start < READ_TIMEOUT + 3


@pytest.mark.parametrize("payload", [b"GARBAGE\r\n\r\n", b"GET /health HTTP/1.1\r\nContent-Length: x\r\n\r\n"])
def test_malformed_http_is_400_with_the_openai_body(srv: Server, payload: bytes) -> None:
    _, answer = raw_exchange(srv, payload)
    assert answer.startswith(b"HTTP/1.1 400") and b"application/json" in answer, answer
    assert b'"type": "BadRequestError"' in answer and b"not valid HTTP/1.1" in answer, answer


def test_body_nobody_reads_is_cut_off_too(srv: Server) -> None:
    # The 404 goes out before the body arrives; uvicorn would otherwise wait for the rest
    # of it (and discard it) for as long as the client dribbles it in.
    seconds, answer = raw_exchange(srv, head("/no/such/route", b"Content-Length: 100\r\n\r\n") + b'{"a": ')
    assert answer.startswith(b"HTTP/1.1 404") and b"NotFoundError" in answer, answer
    assert seconds < READ_TIMEOUT + 3, seconds


def test_body_over_the_limit_is_413(srv: Server) -> None:
    big = {"model": "tiny", "prompt": "x" * MAX_BODY}
    resp = httpx.post(srv.url + "/v1/completions", json=big, headers=AUTH, timeout=60)
    error = assert_openai_error(resp, 413)
    assert "--max-request-body-size" in error["message"] and resp.headers["connection"] == "close"
    # Chunked (no Content-Length): refused once the bytes read pass the limit.
    chunks = (b"x" * 50_000 for _ in range(10))
    resp = httpx.post(srv.url + "/tokenize", content=chunks, headers={**AUTH, "content-type": "application/json"},
                      timeout=60)
    assert_openai_error(resp, 413)
    with pytest.raises(openai.APIStatusError) as info:
        srv.client().completions.create(model="tiny", prompt="y" * MAX_BODY, max_tokens=1)
    assert info.value.status_code == 413
    assert httpx.post(srv.url + "/tokenize", json={"prompt": "small"}, headers=AUTH).status_code == 200


def test_a_compressed_body_is_415_naming_the_encoding(srv: Server) -> None:
    import gzip
    import json

    body = gzip.compress(json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1}).encode())
    resp = httpx.post(srv.url + "/v1/completions", content=body, timeout=60,
                      headers={**AUTH, "content-type": "application/json", "content-encoding": "gzip"})
    error = assert_openai_error(resp, 415)
    assert "Content-Encoding 'gzip' is not supported" in error["message"], error
    plain = {**AUTH, "content-type": "application/json", "content-encoding": "identity"}
    assert httpx.post(srv.url + "/tokenize", content=b'{"prompt": "x"}', headers=plain, timeout=60).status_code == 200


@contextlib.contextmanager
def limits_only_server(limit: int) -> Iterator[tuple[int, threading.Thread, object]]:
    """An in-process uvicorn server with the body limit and the read timeout alone (no
    model): (port, the thread it runs in, the uvicorn.Server), stopped afterwards."""
    import uvicorn

    async def app(scope: dict, receive: object, send: object) -> None:
        raise AssertionError("the body should have been refused before the application")

    limits = http_limits.HttpLimits(max_request_body_size=limit)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(http_limits.RequestLimitsMiddleware(app, limits), port=port,
                                           log_level="warning", lifespan="off", **limits.uvicorn_options()))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        yield port, thread, server
    finally:
        server.should_exit = True
        thread.join(30)


def test_413_on_content_length_reaches_a_client_still_sending() -> None:
    """A body over the limit, refused on its Content-Length while the client is still
    sending it (larger than the sockets' buffers): the client reads the 413. (Closed at
    once, the connection was reset and httpx's async client saw ``ReadError``.)"""
    limit = 4 << 20

    async def post_over_the_limit(port: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            return [await client.post(f"http://127.0.0.1:{port}/v1/completions", content=b"x" * (limit + 1))
                    for _ in range(3)]

    with limits_only_server(limit) as (port, _, _):
        for resp in asyncio.run(post_over_the_limit(port)):
            assert_openai_error(resp, 413)


def test_a_lingering_connection_does_not_hold_up_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    # Discarding a refused body never ends here (an hour); stopping the server ends it.
    monkeypatch.setattr(http_limits, "LINGER_SECONDS", 3600.0)
    with limits_only_server(1000) as (port, thread, server):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + b"x" * 100)
            sock.settimeout(30)
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 413"), answer
            server.should_exit = True  # while the connection lingers, the client silent
            thread.join(30)
            assert not thread.is_alive(), "the server waited for the lingering connection"


def test_sequences_per_request_are_capped(srv: Server) -> None:
    client = srv.client()
    with pytest.raises(openai.BadRequestError, match="--max-sequences-per-request") as info:
        client.completions.create(model="tiny", prompt=["a", "b", "c"], n=2, max_tokens=1)
    assert info.value.param == "n"
    with pytest.raises(openai.BadRequestError, match="5 sequences") as info:
        client.completions.create(model="tiny", prompt=[[1, 2]] * 5, max_tokens=1)
    assert info.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=5, max_tokens=1)
    assert info.value.param == "n"
    ok = client.completions.create(model="tiny", prompt=["a", "b"], n=2, max_tokens=1)
    assert len(ok.choices) == MAX_SEQUENCES
