"""``forkless disagg-proxy`` in front of two real servers, used with the ``openai`` client.

Two ``forkless serve`` processes on the tiny Llama on one ``SharedStorageConnector``
folder (a ``kv_producer`` as prefill server, a ``kv_consumer`` as decode server, both
requiring an API key) and the proxy as its own process. A request through the proxy must
answer exactly what a server without a connector answers (greedy), the prefill server must
have run it once, cut to one token, and the decode server must have loaded the prompt's
KV rather than computed it. Backends that are down sit on free loopback ports nobody
listens on.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import socketserver
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import httpx
import openai
import pytest

from forkless.entrypoints.disagg_proxy import check_backend_url
from tests.conftest import plugin_env, run_forkless
from tests.server.conftest import Server, free_port, start_server, stop_and_check, wait_until
from tests.server.test_metrics import scrape, value

pytestmark = pytest.mark.slow  # two servers start (~10-20 s on the shared CPU)

API_KEY = "sk-disagg-test"
# Over 100 tokens: several KV blocks to hand over.
PROMPT = 3 * ("The disaggregated prefill proxy sends every request twice: first to a prefill server, which "
              "computes the prompt and stores its KV cache, then to a decode server, which loads it. ")
MESSAGES = [{"role": "user", "content": "Tell me about prefill and decode servers. " + PROMPT}]
BLOCK_SIZE = 16  # the servers' KV block (the default): the store holds whole blocks only


def prompt(tag: str) -> str:
    """A prompt no other test sends: the decode server has none of its blocks yet."""
    return f"{tag}: {PROMPT}"


@dataclass
class Proxy:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, api_key: str = API_KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def launch_proxy(tmp: Path, prefill: list[str], decode: list[str], *args: str) -> Proxy:
    """Start ``forkless disagg-proxy`` (``wait_ready`` waits for it to answer)."""
    port = free_port()
    log_path = tmp / f"proxy-{port}.log"
    cmd = [sys.executable, "-m", "forkless.entrypoints.cli.main", "disagg-proxy", "--port", str(port),
           "--uvicorn-log-level", "warning", *args]
    cmd += [a for url in prefill for a in ("--prefill", url)] + [a for url in decode for a in ("--decode", url)]
    proc = subprocess.Popen(cmd, env=plugin_env(None, tmp), stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    return Proxy(proc, port, log_path)


def wait_ready(proxy: Proxy) -> None:
    def answering() -> bool:
        assert proxy.proc.poll() is None, f"the proxy exited with {proxy.proc.returncode}:\n{proxy.log()}"
        try:
            return httpx.get(proxy.url + "/health", timeout=10).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    assert wait_until(answering, 60), f"the proxy did not answer:\n{proxy.log()}"


@pytest.fixture(scope="module")
def stack(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    tmp = tmp_path_factory.mktemp("disagg")
    args = ("--served-model-name", "tiny", "--max-model-len", "512")

    def kv(role: str) -> tuple[str, str]:
        return "--kv-transfer-config", json.dumps({
            "kv_connector": "SharedStorageConnector", "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(tmp / "kv")}})

    with ThreadPoolExecutor(2) as pool:
        started = [pool.submit(start_server, tiny_llama, tmp, *args, *kv(role), api_key=API_KEY)
                   for role in ("kv_producer", "kv_consumer")]
        prefill, decode = (f.result() for f in started)
    held = socket.socket()  # bound, never listening: connections are refused, and nothing else takes the port
    held.bind(("127.0.0.1", 0))
    down = f"http://127.0.0.1:{held.getsockname()[1]}"
    proxies = {
        "main": launch_proxy(tmp, [prefill.url], [decode.url]),
        "decode_down": launch_proxy(tmp, [prefill.url], [down]),
        "prefill_down": launch_proxy(tmp, [down], [decode.url]),
        "round_robin": launch_proxy(tmp, [prefill.url], [decode.url, down]),
    }
    for proxy in proxies.values():
        wait_ready(proxy)
    yield SimpleNamespace(prefill=prefill, decode=decode, down=down, **proxies)
    for proxy in proxies.values():
        proxy.proc.send_signal(signal.SIGTERM)
    for proxy in proxies.values():
        assert proxy.proc.wait(30) == 0, proxy.log()
    for server in (prefill, decode):
        assert stop_and_check(server) == 0, server.log()[-3000:]
    held.close()


class PrefillCalls:
    """What the prefill server's counters say it ran between ``__init__`` and ``check``."""

    def __init__(self, prefill: Server) -> None:
        self.server = prefill
        self.before = scrape(prefill)

    def check(self, requests: int, prompt_tokens: int) -> None:
        """``requests`` requests of one generated token each, ``prompt_tokens`` prompt tokens in all."""
        def delta(samples: list, name: str) -> float:
            return value(samples, name) - value(self.before, name)

        now = wait_until(lambda: (s := scrape(self.server)) and
                         delta(s, "forkless:request_success_total") >= requests and s, 15)
        assert delta(now, "forkless:request_success_total") == requests
        assert delta(now, "forkless:generation_tokens_total") == requests  # max_tokens=1, n=1
        assert delta(now, "forkless:prompt_tokens_total") == prompt_tokens


def external_hits(server: Server) -> float:
    return value(scrape(server), "forkless:external_prefix_cache_hits_total")


def loaded_all_but_the_last_block(hits: float, prompt_tokens: int) -> bool:
    """Whether the decode server took at least the prompt's whole blocks but the last
    from the store (the token it must compute itself may end a block)."""
    return hits >= (prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE - BLOCK_SIZE


def test_completion_answers_what_a_single_server_answers(stack: SimpleNamespace, server: Server) -> None:
    calls, hits = PrefillCalls(stack.prefill), external_hits(stack.decode)
    kwargs = dict(model="tiny", prompt=prompt("completion"), max_tokens=24, n=2, extra_body={"top_k": 1})
    via = stack.main.client().completions.create(**kwargs)
    alone = server.client().completions.create(**kwargs)
    assert [c.text for c in via.choices] == [c.text for c in alone.choices]
    assert via.choices[0].text and len(via.choices) == 2
    assert via.usage == alone.usage
    calls.check(requests=1, prompt_tokens=alone.usage.prompt_tokens)  # n=2 still prefilled once
    assert loaded_all_but_the_last_block(external_hits(stack.decode) - hits, alone.usage.prompt_tokens)


def test_streamed_completion_is_relayed_chunk_by_chunk(stack: SimpleNamespace, server: Server) -> None:
    calls, hits = PrefillCalls(stack.prefill), external_hits(stack.decode)
    kwargs = dict(model="tiny", prompt=prompt("stream"), max_tokens=24, temperature=0)
    chunks = list(stack.main.client().completions.create(**kwargs, stream=True,
                                                         stream_options={"include_usage": True}))
    alone = server.client().completions.create(**kwargs)
    assert len(chunks) > 3  # a stream, not one buffered answer
    assert "".join(c.choices[0].text for c in chunks if c.choices) == alone.choices[0].text
    assert chunks[-1].usage == alone.usage  # stream_options reached the decode server
    calls.check(requests=1, prompt_tokens=alone.usage.prompt_tokens)
    assert loaded_all_but_the_last_block(external_hits(stack.decode) - hits, alone.usage.prompt_tokens)


def test_chat_streamed_and_not_answers_what_a_single_server_answers(stack: SimpleNamespace, server: Server) -> None:
    calls, hits = PrefillCalls(stack.prefill), external_hits(stack.decode)
    kwargs = dict(model="tiny", messages=MESSAGES, max_completion_tokens=20, temperature=0)
    alone = server.client().chat.completions.create(**kwargs)
    via = stack.main.client().chat.completions.create(**kwargs)
    # (the second time, the decode server finds the prompt in its own prefix cache)
    streamed = list(stack.main.client().chat.completions.create(**kwargs, stream=True))
    assert via.choices[0].message.content == alone.choices[0].message.content
    assert via.choices[0].message.content
    assert via.usage == alone.usage
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == alone.choices[0].message.content
    calls.check(requests=2, prompt_tokens=2 * alone.usage.prompt_tokens)  # max_completion_tokens cut to 1 too
    assert loaded_all_but_the_last_block(external_hits(stack.decode) - hits, alone.usage.prompt_tokens)


def test_a_backend_error_comes_back_unchanged(stack: SimpleNamespace) -> None:
    bad = dict(model="tiny", prompt=PROMPT, max_tokens=4, temperature=-1)
    with pytest.raises(openai.BadRequestError) as via:
        stack.main.client().completions.create(**bad)
    with pytest.raises(openai.BadRequestError) as direct:
        stack.decode.client().completions.create(**bad)
    assert via.value.response.json() == direct.value.response.json()
    assert "temperature" in via.value.message
    # The prefill server's refusal ends the request: the proxy whose decode server is
    # down answers it, not a 502.
    with pytest.raises(openai.BadRequestError):
        stack.decode_down.client().completions.create(**bad)
    with pytest.raises(openai.BadRequestError):
        stack.decode_down.client().chat.completions.create(model="tiny", messages=MESSAGES, temperature=-1,
                                                           stream=True)
    # The client's Authorization header is what the backends see.
    with pytest.raises(openai.AuthenticationError):
        stack.main.client(api_key="sk-wrong").completions.create(model="tiny", prompt=PROMPT, max_tokens=2)


def test_malformed_bodies_and_unknown_routes_get_openai_errors(stack: SimpleNamespace) -> None:
    r = httpx.post(stack.main.url + "/v1/completions", content=b'{"model": "tiny", "prompt": ',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(stack.main.url + "/v1/chat/completions", json=["not", "an", "object"])
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    r = httpx.post(stack.main.url + "/v1/embeddings", json={"model": "tiny", "input": "x"})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "NotFoundError" and "/v1/embeddings" in r.json()["error"]["message"]


def test_a_backend_that_is_down_is_named_in_a_502(stack: SimpleNamespace) -> None:
    for proxy, role in ((stack.decode_down, "decode"), (stack.prefill_down, "prefill")):
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as exc:
                proxy.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=4, stream=stream)
            assert exc.value.status_code == 502
            error = exc.value.response.json()["error"]
            assert f"the {role} server at {stack.down} could not be reached" in error["message"]
            assert error["type"] == "BadGatewayError"


def test_several_decode_servers_are_used_in_turn(stack: SimpleNamespace) -> None:
    # --decode GOOD --decode DOWN: every other request fails, whichever comes first.
    statuses = []
    for _ in range(4):
        r = httpx.post(stack.round_robin.url + "/v1/completions", timeout=60,
                       headers={"authorization": f"Bearer {API_KEY}"},
                       json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
        statuses.append(r.status_code)
    assert statuses in ([200, 502, 200, 502], [502, 200, 502, 200])


def test_health_names_the_failing_backend(stack: SimpleNamespace) -> None:
    assert httpx.get(stack.main.url + "/health").status_code == 200
    for proxy, role in ((stack.decode_down, "decode"), (stack.prefill_down, "prefill")):
        r = httpx.get(proxy.url + "/health", timeout=30)
        assert r.status_code == 503
        assert f"the {role} server at {stack.down}" in r.json()["error"]["message"]


def test_models_come_from_the_decode_server(stack: SimpleNamespace) -> None:
    assert [m.id for m in stack.main.client().models.list()] == [m.id for m in stack.decode.client().models.list()]
    with pytest.raises(openai.AuthenticationError):
        stack.main.client(api_key="sk-wrong").models.list()


def test_a_client_that_hangs_up_aborts_the_decode_request(stack: SimpleNamespace) -> None:
    before = scrape(stack.decode)
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 300, "ignore_eos": True, "temperature": 0,
            "stream": True}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", stack.main.url + "/v1/completions", json=body,
                           headers={"authorization": f"Bearer {API_KEY}"}) as r:
            assert r.status_code == 200
            next(r.iter_raw())  # the first chunk arrived: decoding is under way; then hang up

    def idle() -> bool:
        m = scrape(stack.decode)
        return value(m, "forkless:kv_cache_usage_perc") == 0 and value(m, "forkless:num_requests_running") == 0

    assert wait_until(idle, 15), "the decode server still runs the request of a client that left"
    # aborted, not run to the end: far fewer than 300 tokens were generated
    after = scrape(stack.decode)
    assert value(after, "forkless:generation_tokens_total") - value(before, "forkless:generation_tokens_total") < 300


class BrokenStreamBackend(socketserver.ThreadingTCPServer):
    """A backend that breaks off its stream: it answers the prefill call and ``/health``,
    then sends a streamed answer's first event and part of a second, in a chunked body
    cut short (as when a server dies mid-stream), and closes the connection.

    Its JSON answers carry ``kv_transfer_params`` (as vLLM's prefill servers' do for
    connectors that pair the two requests); ``seen`` records each request's headers and body.
    """

    FIRST = b'data: {"id":"cmpl-1","object":"text_completion","created":0,"model":"tiny",' \
            b'"choices":[{"index":0,"text":"Hello","finish_reason":null}]}\n\n'
    daemon_threads = True

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += self.rfile.read(1)
            length = re.search(rb"content-length: *(\d+)", head, flags=re.I)
            body = json.loads(self.rfile.read(int(length.group(1)))) if length else {}
            self.server.seen.append((head.decode().lower(), body))
            if not body.get("stream"):
                answer = b'{"id":"cmpl-0","choices":[],"kv_transfer_params":{"remote_block_ids":[1,2]}}'
                self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(answer), answer))
                return
            half = b'data: {"id":"cmpl-1","choi'
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
            self.wfile.write(b"%x\r\n%s\r\n" % (len(self.server.FIRST), self.server.FIRST))
            self.wfile.write(b"%x\r\n%s" % (len(half) + 100, half))  # 100 bytes short
            self.wfile.flush()

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []
        super().__init__(("127.0.0.1", 0), self.Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def broken(tmp_path: Path) -> Iterator[tuple[BrokenStreamBackend, Proxy]]:
    """A proxy whose prefill and decode server is one ``BrokenStreamBackend``."""
    backend = BrokenStreamBackend()
    proxy = launch_proxy(tmp_path, [backend.url], [backend.url], "--max-request-body-size", "4096")
    try:
        wait_ready(proxy)
        backend.seen.clear()
        yield backend, proxy
    finally:
        proxy.proc.send_signal(signal.SIGTERM)
        assert proxy.proc.wait(30) == 0, proxy.log()
        backend.shutdown()
        backend.server_close()


def test_a_stream_broken_off_upstream_ends_with_an_error_event(broken: tuple[BrokenStreamBackend, Proxy]) -> None:
    backend, proxy = broken
    r = httpx.post(proxy.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "stream": True})
    assert r.status_code == 200
    # The whole first event, then (the half event dropped) an error event and [DONE].
    first, error, done, rest = r.content.split(b"\n\n")
    assert first + b"\n\n" == BrokenStreamBackend.FIRST
    message = json.loads(error.removeprefix(b"data: "))["error"]["message"]
    assert message.startswith(f"the decode server at {backend.url} broke off the stream: RemoteProtocolError")
    assert (done, rest) == (b"data: [DONE]", b"")
    texts = []
    with pytest.raises(openai.APIError, match="broke off the stream"):
        for chunk in proxy.client().completions.create(model="tiny", prompt="x", stream=True):
            texts.append(chunk.choices[0].text)
    assert texts == ["Hello"]


def test_the_prefill_call_is_cut_to_one_token_and_kv_transfer_params_go_on(
        broken: tuple[BrokenStreamBackend, Proxy]) -> None:
    backend, proxy = broken
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 50, "max_completion_tokens": 40, "n": 2,
            "min_tokens": 5, "temperature": 0}  # (the backend is a stand-in: nothing samples it)
    r = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer k1"})
    assert r.status_code == 200 and r.json()["kv_transfer_params"] == {"remote_block_ids": [1, 2]}
    (prefill_head, prefill_body), (decode_head, decode_body) = backend.seen
    assert prefill_body == {"model": "tiny", "messages": MESSAGES, "max_tokens": 1, "max_completion_tokens": 1,
                            "n": 1, "temperature": 0, "stream": False}
    assert decode_body == {**body, "kv_transfer_params": {"remote_block_ids": [1, 2]}}
    for head in (prefill_head, decode_head):
        assert "authorization: bearer k1\r\n" in head
    request_id = re.search(r"x-request-id: (\S+)", prefill_head).group(1)
    assert f"x-request-id: {request_id}\r\n" in decode_head  # one id for both calls


def test_a_body_over_the_limit_is_refused_before_any_backend_call(broken: tuple[BrokenStreamBackend, Proxy]) -> None:
    backend, proxy = broken
    r = httpx.post(proxy.url + "/v1/completions", json={"model": "tiny", "prompt": "x" * 5000})
    assert r.status_code == 413 and "the limit is 4096" in r.json()["error"]["message"]
    assert backend.seen == []


def test_malformed_backend_urls_fail_at_once_naming_the_value(tmp_path: Path) -> None:
    for bad in ("localhost:8100", "http://127.0.0.1:8100/v1", "ftp://127.0.0.1:8100", "http://127.0.0.1:99999",
                "http://:8100", "http://user@127.0.0.1:8100"):
        with pytest.raises(ValueError, match=re.escape(f"got {bad!r}")):
            check_backend_url(bad)
    assert check_backend_url("http://127.0.0.1:8100/") == "http://127.0.0.1:8100"
    env = plugin_env(None, tmp_path)
    out = run_forkless(["disagg-proxy", "--prefill", "127.0.0.1:8100", "--decode", "http://127.0.0.1:8200"], env,
                       timeout=60)
    assert out.returncode == 2
    assert ("argument --prefill: expected http://HOST:PORT or https://HOST:PORT (no path), got '127.0.0.1:8100'"
            in out.stderr)
    out = run_forkless(["disagg-proxy", "--prefill", "http://127.0.0.1:8100"], env, timeout=60)
    assert out.returncode == 2 and "--decode" in out.stderr
