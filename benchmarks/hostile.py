"""Hostile clients: how much does one abusive client slow everyone else down?

Starts ``forkless serve`` (the embedded default model unless ``--model``), then sends a
stream of normal requests -- 16-token prompts asking for 16 tokens, one every
``1 / --rate`` seconds (open loop: a slow server does not slow the stream down) -- for
``--duration`` seconds, and measures each one's end-to-end latency. First alone (the
baseline), then once per hostile case with that case's client running alongside. It
prints the p50 and p99 latencies and the ratio of each case's p99 to the baseline's;
the target is within 2x.

    python benchmarks/hostile.py                                 # every case, ~12 min on a shared 2-core CPU
    python benchmarks/hostile.py --cases bad-text slowloris --duration 15
    python benchmarks/hostile.py --server-args --long-prefill-token-threshold 0
    python benchmarks/hostile.py --hostile-address 127.0.0.1   # hostile and normal: one client
    python benchmarks/hostile.py --cases bad-text disconnects --baseline-each   # a baseline before each

The hostile client connects from ``--hostile-address`` (127.0.0.2, a loopback address of
its own) and the normal requests from 127.0.0.1, so that the server sees two clients, as
it would see two users on two machines (its per-client share,
``--max-prefill-tokens-per-client``, keys on the peer address when a request has no
``user``).

Adding a case: write an ``async def my_case(ctx: Context) -> None`` that keeps abusing
the server until it is cancelled -- usually ``await repeat(ctx, "what", send, expected={...})``,
which sends back to back and records in ``ctx.notes`` what went out and what came back,
flagging any status not expected -- and append ``HostileCase("name", "what it does",
my_case)`` to :data:`HOSTILE_CASES`. After each case the script waits until the server has
no request left running or waiting (``/metrics``), and says so if that takes long.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import httpx

# SIGTERM, then SIGKILL the group after 60 s (shared with forkless bench serve).
from forkless.bench.serve import stop_server

NORMAL_PROMPT_TOKENS = 16
NORMAL_MAX_TOKENS = 16
JSON = {"content-type": "application/json"}
LONE = "@LONE@"  # as_json() writes it as the JSON escape of a lone surrogate


@dataclass
class Context:
    """What a hostile client gets: the server, a seeded generator, and a place to report.

    Attributes:
        base_url: The OpenAI API root (``http://127.0.0.1:PORT/v1``).
        source: The local address the hostile client connects from.
        model: The served model name.
        max_model_len: The server's context length.
        max_body: The server's --max-request-body-size.
        max_sequences: The server's --max-sequences-per-request.
        rng: Seeded, for reproducible prompts.
        notes: Lines the case wants printed under its result.
    """

    base_url: str
    model: str
    max_model_len: int
    max_body: int
    max_sequences: int
    rng: random.Random
    source: str = "127.0.0.2"
    notes: list[str] = field(default_factory=list)

    @property
    def root_url(self) -> str:
        return self.base_url.removesuffix("/v1")


@dataclass
class HostileCase:
    """One kind of abuse.

    Attributes:
        name: Short name (``--cases`` selects by it).
        description: One line for the report.
        run: Abuses the server until cancelled.
    """

    name: str
    description: str
    run: Callable[[Context], Awaitable[None]]


def random_prompt(rng: random.Random, n: int) -> list[int]:
    # Token ids, not text: exact lengths, and no two prompts share a prefix-cache block.
    return [rng.randrange(100, 20000) for _ in range(n)]


# What one hostile request came to: an HTTP status, or a word for what happened instead
# (the server closed the connection, an httpx error's class name), and a sample of the answer.
Outcome = tuple["int | str", str]
Send = Callable[[httpx.AsyncClient], Awaitable[Outcome]]


async def repeat(ctx: Context, what: str, send: Send, expected: set, concurrency: int = 1) -> None:
    """Runs ``send`` back to back in ``concurrency`` workers until cancelled, then notes how
    many went out, what came back, and -- loudly -- any outcome not in ``expected``."""
    counts: Counter = Counter()
    first_seen: dict = {}
    seconds: list[float] = []
    started = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal started
        while True:
            started += 1
            t0 = time.perf_counter()
            try:
                outcome, detail = await send(client)
            except (httpx.HTTPError, OSError) as exc:
                outcome, detail = type(exc).__name__, repr(exc)
            seconds.append(time.perf_counter() - t0)
            counts[outcome] += 1
            first_seen.setdefault(outcome, detail)

    # A new connection for each request: on a kept-alive one the server's answers now wait
    # ~40 ms each for the client's delayed ACK (its sockets lack TCP_NODELAY), which would
    # slow a client sending as fast as it is answered down to ~20 requests a second.
    transport = httpx.AsyncHTTPTransport(local_address=ctx.source, limits=httpx.Limits(
        max_connections=concurrency, max_keepalive_connections=0))
    async with httpx.AsyncClient(base_url=ctx.root_url, timeout=None, transport=transport) as client:
        try:
            await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        finally:
            answered = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=str)) or "none"
            mean = f" (mean {sum(seconds) / len(seconds):.2f} s)" if seconds else ""
            ctx.notes.append(f"{what}: {started} sent, {sum(counts.values())} answered{mean}: {answered}")
            for outcome in sorted(set(counts) - expected, key=str):
                ctx.notes.append(f"!!! UNEXPECTED {outcome} x{counts[outcome]} (expected {sorted(expected, key=str)}); "
                                 f"first: {first_seen[outcome][:300]!r}")


def request(method: str, path: str, body: bytes | None = None) -> Send:
    """A ``send`` for :func:`repeat`: one request, its status and the start of its answer."""
    async def send(client: httpx.AsyncClient) -> Outcome:
        r = await client.request(method, path, content=body, headers=JSON)
        return r.status_code, r.text[:300]
    return send


def in_turn(*sends: Send) -> Send:
    """A ``send`` that is each of ``sends`` in turn."""
    turns = itertools.cycle(sends)
    return lambda client: next(turns)(client)


def as_json(obj: object) -> bytes:
    # LONE stands for a lone surrogate, which Python's json cannot write: a client with a
    # buggy encoder (or a hostile one) sends the escape.
    return json.dumps(obj).replace(LONE, "\\ud800").encode()


async def bad_text_client(ctx: Context) -> None:
    """Lone surrogates in prompts, chat messages and model names, as fast as answered."""
    chat = [{"role": "user", "content": "hi"}]
    await repeat(ctx, "lone surrogates", in_turn(*(request("POST", path, as_json(body)) for path, body in [
        ("/v1/completions", {"model": ctx.model, "prompt": f"a{LONE}b", "max_tokens": 16}),
        ("/v1/completions", {"model": ctx.model, "prompt": ["ok", LONE], "max_tokens": 16}),
        ("/v1/completions", {"model": LONE, "prompt": "hi", "max_tokens": 16}),
        ("/v1/chat/completions", {"model": ctx.model, "messages": [{"role": "user", "content": LONE}]}),
        ("/v1/chat/completions", {"model": LONE, "messages": chat}),
    ])), expected={400})


async def malformed_client(ctx: Context) -> None:
    """Bad JSON, wrong types, unknown routes, wrong methods, as fast as answered."""
    await repeat(ctx, "malformed requests", in_turn(*(request(*r) for r in [
        ("POST", "/v1/completions", b'{"model": "x", "prompt": '),
        ("POST", "/v1/completions", b"[1, 2]"),
        ("POST", "/v1/completions", b'{"prompt": "\xff\xfe"}'),
        ("POST", "/v1/completions", b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
        ("POST", "/v1/completions", as_json({"model": ctx.model, "prompt": "hi", "max_tokens": "ten"})),
        ("POST", "/v1/chat/completions", as_json({"model": ctx.model, "messages": [{"content": 1}]})),
        ("GET", "/no/such/route"),
        ("POST", "/v1/nothing", b"{}"),
        ("DELETE", "/v1/completions"),
        ("GET", "/v1/chat/completions"),
    ])), expected={400, 404, 405})


async def huge_body_client(ctx: Context) -> None:
    """Bodies one byte over the limit, back to back: in turn with a Content-Length (refused
    at once) and chunked (refused once the server has read past the limit)."""
    over = b'{"prompt": "' + b"x" * (ctx.max_body - 13) + b'"}'  # max_body + 1 bytes

    async def chunked(client: httpx.AsyncClient) -> Outcome:
        async def chunks():
            for i in range(0, len(over), 1 << 20):
                yield over[i:i + (1 << 20)]
        r = await client.post("/v1/completions", content=chunks(), headers=JSON)
        return r.status_code, r.text[:300]

    await repeat(ctx, f"{len(over):,}-byte bodies", in_turn(request("POST", "/v1/completions", over), chunked),
                 expected={413})


async def huge_prompt_client(ctx: Context) -> None:
    """~10 MB prompts under the body limit, back to back: tokenized (off the event loop), then
    refused for their length."""
    text = "hello world, this is a long prompt. " * (10_000_000 // 36)
    await repeat(ctx, f"{len(text):,}-character prompts", request("POST", "/v1/completions", as_json({
        "model": ctx.model, "prompt": text, "max_tokens": 16})), expected={400})


async def slowloris_client(ctx: Context) -> None:
    """50 connections sending a request's head and body 4 bytes every 0.25 s (the
    body never arrives within --request-read-timeout); each one cut off is opened again."""
    body = as_json({"model": ctx.model, "prompt": random_prompt(ctx.rng, 150), "max_tokens": 16})
    payload = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    host, port = httpx.URL(ctx.root_url).host, httpx.URL(ctx.root_url).port

    async def dribble(_: httpx.AsyncClient) -> Outcome:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(ctx.source, 0))
        try:
            for i in range(0, len(payload), 4):
                writer.write(payload[i:i + 4])
                try:  # waits a quarter of a second, unless the server answers or closes first
                    answer = await asyncio.wait_for(reader.read(300), 0.25)
                    break
                except asyncio.TimeoutError:
                    pass
            else:  # all sent in time after all
                answer = await reader.read(300)
            if not answer:
                return "closed by the server", ""
            return int(answer.split()[1]), answer.decode(errors="replace")
        finally:
            writer.close()

    await repeat(ctx, "slow connections", dribble, expected={408, "closed by the server"}, concurrency=50)


async def many_seqs_client(ctx: Context) -> None:
    """One request for the most sequences a request may have (prompts x n), 16 tokens each,
    sent again as soon as it is answered."""
    n = 8

    async def send(client: httpx.AsyncClient) -> Outcome:
        prompts = [random_prompt(ctx.rng, NORMAL_PROMPT_TOKENS) for _ in range(ctx.max_sequences // n)]
        return await request("POST", "/v1/completions", as_json({
            "model": ctx.model, "prompt": prompts, "n": n, "max_tokens": 16, "ignore_eos": True}))(client)

    await repeat(ctx, f"requests for {ctx.max_sequences // n * n} sequences", send, expected={200})


async def stop_strings_client(ctx: Context) -> None:
    """A request with 100,000 distinct stop strings, 16 tokens out, again and again."""
    stop = [f"\u2603{n}" + "#" * (n % 12) for n in range(100_000)]  # a dozen lengths, never written
    body = as_json({"model": ctx.model, "prompt": random_prompt(ctx.rng, NORMAL_PROMPT_TOKENS), "max_tokens": 16,
                    "ignore_eos": True, "stop": stop})
    await repeat(ctx, f"{len(body):,}-byte requests with {len(stop):,} stop strings",
                 request("POST", "/v1/completions", body), expected={200})


async def disconnects_client(ctx: Context) -> None:
    """32 clients streaming 1,000-token completions, each dropping its connection after the
    first chunk and opening the next."""
    async def send(client: httpx.AsyncClient) -> Outcome:
        body = {"model": ctx.model, "prompt": random_prompt(ctx.rng, NORMAL_PROMPT_TOKENS), "max_tokens": 1000,
                "ignore_eos": True, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return r.status_code, (await r.aread()).decode(errors="replace")
            async for _ in r.aiter_raw():
                break  # leaving the block closes the connection mid-stream
        return r.status_code, ""

    await repeat(ctx, "streams dropped after their first chunk", send, expected={200}, concurrency=32)


async def long_prompt_client(ctx: Context) -> None:
    """One client sending ~8k-token prompts back to back (one in flight, 1 token each)."""
    length = min(8000, ctx.max_model_len - 8)

    async def send(client: httpx.AsyncClient) -> Outcome:
        return await request("POST", "/v1/completions", as_json({
            "model": ctx.model, "prompt": random_prompt(ctx.rng, length), "max_tokens": 1, "temperature": 0.0}))(client)

    await repeat(ctx, f"prompts of {length} tokens", send, expected={200})


HOSTILE_CASES: list[HostileCase] = [
    HostileCase("bad-text", "lone surrogates in prompts, messages and model names, as fast as answered (400s)",
                bad_text_client),
    HostileCase("malformed", "bad JSON, wrong types, 404 routes, 405 methods, as fast as answered", malformed_client),
    HostileCase("huge-body", "bodies just over --max-request-body-size (413), back to back", huge_body_client),
    HostileCase("huge-prompt", "~10 MB prompt strings (400 after tokenizing), back to back", huge_prompt_client),
    HostileCase("slowloris", "50 connections sending head and body 4 bytes every 0.25 s", slowloris_client),
    HostileCase("many-seqs", "one request at --max-sequences-per-request (16 tokens each), again when answered",
                many_seqs_client),
    HostileCase("stop-strings", "a 16-token request with 100,000 stop strings, again when answered",
                stop_strings_client),
    HostileCase("disconnects", "32 streams at a time, each dropped after its first chunk", disconnects_client),
    HostileCase("long-prompt", "one client sending ~8k-token prompts back to back", long_prompt_client),
]


# ----------------------------------------------------------------------- measuring


async def normal_request(client: httpx.AsyncClient, base_url: str, model: str, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    r = await client.post(f"{base_url}/completions", json={
        "model": model, "prompt": prompt, "max_tokens": NORMAL_MAX_TOKENS, "temperature": 0.0,
        "ignore_eos": True})
    r.raise_for_status()
    assert r.json()["usage"]["completion_tokens"] == NORMAL_MAX_TOKENS
    return time.perf_counter() - t0


async def normal_stream(base_url: str, model: str, rate: float, duration: float, seed: int) -> list[float]:
    """Latencies of the normal requests sent at ``rate`` per second for ``duration`` s."""
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=None) as client:
        tasks = []
        start = time.perf_counter()
        n = int(duration * rate)
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            prompt = random_prompt(rng, NORMAL_PROMPT_TOKENS)
            tasks.append(asyncio.create_task(normal_request(client, base_url, model, prompt)))
        return list(await asyncio.gather(*tasks))


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


async def run_case(case: HostileCase | None, args: argparse.Namespace, base_url: str, model: str,
                   max_model_len: int) -> tuple[list[float], list[str]]:
    ctx = Context(base_url, model, max_model_len, server_flag(args, "--max-request-body-size", 32 << 20),
                  server_flag(args, "--max-sequences-per-request", 256), random.Random(args.seed + 1),
                  args.hostile_address)
    hostile = None
    if case is not None:
        hostile = asyncio.create_task(case.run(ctx))
        await asyncio.sleep(args.warmup)  # the abuse is under way before we measure
    try:
        latencies = await normal_stream(base_url, model, args.rate, args.duration, args.seed)
    finally:
        if hostile is not None:
            hostile.cancel()
            await asyncio.gather(hostile, return_exceptions=True)
    if hostile is not None and hostile.done() and not hostile.cancelled() and hostile.exception():
        ctx.notes.append(f"!!! the hostile client failed: {hostile.exception()!r}")
    if case is not None:
        await wait_until_idle(ctx)
    return latencies, ctx.notes


def server_flag(args: argparse.Namespace, flag: str, default: int) -> int:
    """An integer flag's value in --server-args (given as ``FLAG VALUE``), else the server's default."""
    given = args.server_args
    return int(given[given.index(flag) + 1]) if flag in given else default


async def wait_until_idle(ctx: Context, limit: float = 60.0) -> None:
    """Waits until the server has no request running or waiting; notes it if that took a while."""
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=30) as client:
        while True:
            metrics = (await client.get(f"{ctx.root_url}/metrics")).text
            left = sum(float(line.split()[-1]) for line in metrics.splitlines()
                       if line.startswith(("forkless:num_requests_running", "forkless:num_requests_waiting")))
            waited = time.perf_counter() - t0
            if not left:
                if waited > 2:
                    ctx.notes.append(f"the server was idle {waited:.1f} s after the hostile client stopped")
                return
            if waited > limit:
                ctx.notes.append(f"!!! {left:g} requests still running or waiting {limit:g} s after the hostile "
                                 "client stopped")
                return
            await asyncio.sleep(0.2)


# -------------------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, port: int, log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", *([args.model] if args.model else []),
           "--port", str(port), "--uvicorn-log-level", "warning", "--disable-log-stats", *args.server_args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.perf_counter()
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"forkless serve exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.perf_counter() - t0 > 300:
            stop_server(proc)
            raise SystemExit(f"no /health OK within 300 s; see {log.name}")
        time.sleep(0.1)


def load_average() -> str:
    """The machine's load average at the end of a case: on a shared machine, whether a
    figure was measured alone."""
    one, five, _ = os.getloadavg()
    return f"load average at the end: {one:.2f} (1 min), {five:.2f} (5 min)"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    ap.add_argument("--cases", nargs="*", default=None, metavar="NAME",
                    help=f"hostile cases to run (default: all of {', '.join(c.name for c in HOSTILE_CASES)})")
    ap.add_argument("--rate", type=float, default=1.0, help="normal requests per second")
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of normal requests per case")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of abuse before measuring")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-each", action="store_true",
                    help="measure the baseline again before each case (on a shared machine whose load "
                         "changes, each ratio then compares like with like)")
    ap.add_argument("--hostile-address", default="127.0.0.2",
                    help="local address the hostile client connects from (the normal requests come from "
                         "127.0.0.1; give 127.0.0.1 to make them one client)")
    ap.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                    help="everything after this goes to forkless serve")
    args = ap.parse_args()
    cases = HOSTILE_CASES if args.cases is None else [c for c in HOSTILE_CASES if c.name in args.cases]
    unknown = set(args.cases or ()) - {c.name for c in HOSTILE_CASES}
    if unknown:
        raise SystemExit(f"unknown case(s) {sorted(unknown)}; choose from {[c.name for c in HOSTILE_CASES]}")

    log = tempfile.NamedTemporaryFile("wb", prefix="forkless-hostile-", suffix=".log", delete=False)
    port = free_port()
    t0 = time.perf_counter()
    proc = start_server(args, port, log)
    print(f"{cpu_model()}, {os.cpu_count()} cores; server up in {time.perf_counter() - t0:.1f} s "
          f"(log {log.name}); server args: {' '.join(args.server_args) or '(defaults)'}; hostile client "
          f"from {args.hostile_address}", flush=True)
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        info = httpx.get(f"{base_url}/models").json()["data"][0]
        model, max_model_len = info["id"], int(info.get("max_model_len") or 8192)
        asyncio.run(normal_stream(base_url, model, 4.0, 1.0, args.seed + 99))  # warm-up
        print(f"normal requests: {NORMAL_PROMPT_TOKENS}-token prompts, {NORMAL_MAX_TOKENS} tokens out, "
              f"{args.rate:g}/s for {args.duration:g} s per case", flush=True)
        rows: list[tuple[str, list[float], list[str]]] = []
        baseline: list[float] = []
        for i, case in enumerate(cases):
            if i == 0 or args.baseline_each:
                baseline, _ = asyncio.run(run_case(None, args, base_url, model, max_model_len))
                rows.append(("baseline (no hostile client)", baseline, [load_average()]))
                print(f"  baseline: p50 {percentile(baseline, 50):.2f} s, p99 {percentile(baseline, 99):.2f} s",
                      flush=True)
            latencies, notes = asyncio.run(run_case(case, args, base_url, model, max_model_len))
            rows.append((case.name, latencies, [*notes, load_average()]))
            print(f"  {case.name}: p50 {percentile(latencies, 50):.2f} s, p99 {percentile(latencies, 99):.2f} s",
                  flush=True)
    finally:
        stop_server(proc)

    print()
    print(f"{'case':<30}{'requests':>9}{'p50 s':>9}{'p99 s':>9}{'p99 ratio':>11}")
    base_p99 = 0.0
    for name, latencies, notes in rows:
        p99 = percentile(latencies, 99)
        if name.startswith("baseline"):  # each case's ratio is to the baseline before it
            base_p99 = p99
        ratio = p99 / base_p99
        flag = "" if name.startswith("baseline") else ("  ok (<= 2x)" if ratio <= 2 else "  OVER 2x")
        print(f"{name:<30}{len(latencies):>9}{percentile(latencies, 50):>9.2f}{p99:>9.2f}{ratio:>10.2f}x{flag}")
        for note in notes:
            print(f"{'':<4}{note}")


if __name__ == "__main__":
    main()
