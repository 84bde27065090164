"""Hostile clients: how much does one abusive client slow everyone else down?

Starts ``forkless serve`` (the embedded default model unless ``--model``), then sends a
stream of normal requests -- 16-token prompts asking for 16 tokens, one every
``1 / --rate`` seconds (open loop: a slow server does not slow the stream down) -- for
``--duration`` seconds, and measures each one's end-to-end latency. First alone (the
baseline), then once per hostile case with that case's client running alongside. It
prints the p50 and p99 latencies and the ratio of each case's p99 to the baseline's;
the target is within 2x.

    python benchmarks/hostile.py                                 # every case, ~2-3 min
    python benchmarks/hostile.py --cases long-prompt --duration 30
    python benchmarks/hostile.py --server-args --long-prefill-token-threshold 0

Adding a case: write an ``async def my_case(ctx: Context) -> None`` that keeps abusing
the server until it is cancelled (record what it achieved in ``ctx.notes``), and append
``HostileCase("name", "what it does", my_case)`` to :data:`HOSTILE_CASES`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import httpx

# benchmarks/serve.py's: SIGTERM, then SIGKILL the group after 60 s (run as a script, this
# folder is on sys.path).
from serve import stop_server

NORMAL_PROMPT_TOKENS = 16
NORMAL_MAX_TOKENS = 16


@dataclass
class Context:
    """What a hostile client gets: the server, a seeded generator, and a place to report.

    Attributes:
        base_url: The OpenAI API root (``http://127.0.0.1:PORT/v1``).
        model: The served model name.
        max_model_len: The server's context length.
        rng: Seeded, for reproducible prompts.
        notes: Lines the case wants printed under its result.
    """

    base_url: str
    model: str
    max_model_len: int
    rng: random.Random
    notes: list[str] = field(default_factory=list)


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


async def long_prompt_client(ctx: Context) -> None:
    """One client sending ~8k-token prompts back to back (one in flight, 1 token each)."""
    length = min(8000, ctx.max_model_len - 8)
    done: list[float] = []
    async with httpx.AsyncClient(timeout=None) as client:
        try:
            while True:
                t0 = time.perf_counter()
                r = await client.post(f"{ctx.base_url}/completions", json={
                    "model": ctx.model, "prompt": random_prompt(ctx.rng, length), "max_tokens": 1,
                    "temperature": 0.0})
                r.raise_for_status()
                done.append(time.perf_counter() - t0)
        finally:
            mean = f", {sum(done) / len(done):.1f} s each" if done else ""
            ctx.notes.append(f"{len(done)} prompts of {length} tokens completed{mean}")


HOSTILE_CASES: list[HostileCase] = [
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
    ctx = Context(base_url, model, max_model_len, random.Random(args.seed + 1))
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
        ctx.notes.append(f"the hostile client failed: {hostile.exception()!r}")
    return latencies, ctx.notes


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
          f"(log {log.name}); server args: {' '.join(args.server_args) or '(defaults)'}", flush=True)
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        info = httpx.get(f"{base_url}/models").json()["data"][0]
        model, max_model_len = info["id"], int(info.get("max_model_len") or 8192)
        asyncio.run(normal_stream(base_url, model, 4.0, 1.0, args.seed + 99))  # warm-up
        print(f"normal requests: {NORMAL_PROMPT_TOKENS}-token prompts, {NORMAL_MAX_TOKENS} tokens out, "
              f"{args.rate:g}/s for {args.duration:g} s per case", flush=True)
        rows: list[tuple[str, list[float], list[str]]] = []
        baseline, _ = asyncio.run(run_case(None, args, base_url, model, max_model_len))
        rows.append(("baseline (no hostile client)", baseline, []))
        print(f"  baseline: p50 {percentile(baseline, 50):.2f} s, p99 {percentile(baseline, 99):.2f} s", flush=True)
        for case in cases:
            latencies, notes = asyncio.run(run_case(case, args, base_url, model, max_model_len))
            rows.append((case.name, latencies, notes))
            print(f"  {case.name}: p50 {percentile(latencies, 50):.2f} s, p99 {percentile(latencies, 99):.2f} s",
                  flush=True)
    finally:
        stop_server(proc)

    base_p99 = percentile(baseline, 99)
    print()
    print(f"{'case':<30}{'requests':>9}{'p50 s':>9}{'p99 s':>9}{'p99 ratio':>11}")
    for name, latencies, notes in rows:
        p99 = percentile(latencies, 99)
        ratio = p99 / base_p99
        flag = "" if name.startswith("baseline") else ("  ok (<= 2x)" if ratio <= 2 else "  OVER 2x")
        print(f"{name:<30}{len(latencies):>9}{percentile(latencies, 50):>9.2f}{p99:>9.2f}{ratio:>10.2f}x{flag}")
        for note in notes:
            print(f"{'':<4}{note}")


if __name__ == "__main__":
    main()
