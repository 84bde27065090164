"""Online serving: ``forkless serve`` under N concurrent streaming requests.

Starts ``forkless serve`` (the embedded default model unless ``--model``), times it from
process start to ``/health`` OK, then sends N streaming completions with the ``openai``
async client -- random token-id prompts of random lengths, each run to its own output
length (``ignore_eos``) -- at most ``--concurrency`` in flight. It reports what
``vllm bench serve`` reports: request throughput, output tokens/s, time to first token
(TTFT) and inter-token latency (ITL, the gap between consecutive streamed chunks)
p50/p99. The baseline is the same requests sent one at a time to the same server.

    python benchmarks/serve.py                         # default model, 16 requests
    python benchmarks/serve.py -n 32 --concurrency 8 --output-len 64 128
    python benchmarks/serve.py --startup-only --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class RequestResult:
    ttft: float
    itls: list[float]
    latency: float
    output_tokens: int


@dataclass
class RunResult:
    duration: float
    requests: list[RequestResult] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        ttfts = [r.ttft for r in self.requests]
        itls = [x for r in self.requests for x in r.itls]
        out = sum(r.output_tokens for r in self.requests)
        return {
            "req/s": len(self.requests) / self.duration,
            "out tok/s": out / self.duration,
            "TTFT p50 ms": _pct(ttfts, 50) * 1e3,
            "TTFT p99 ms": _pct(ttfts, 99) * 1e3,
            "ITL p50 ms": _pct(itls, 50) * 1e3,
            "ITL p99 ms": _pct(itls, 99) * 1e3,
            "E2E p50 s": _pct([r.latency for r in self.requests], 50),
        }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, port: int, log) -> tuple[subprocess.Popen, float]:
    """Start ``forkless serve``; return the process and seconds until ``/health`` said OK."""
    cmd = [sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", *([args.model] if args.model else []),
           "--port", str(port), "--max-model-len", str(args.max_model_len), "--max-num-seqs",
           str(args.max_num_seqs), "--kv-cache-memory", str(args.kv_cache_mib << 20),
           "--uvicorn-log-level", "warning", "--disable-log-stats", *args.server_args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/health"
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"forkless serve exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return proc, time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        if time.perf_counter() - t0 > args.startup_timeout:
            stop_server(proc)
            raise SystemExit(f"no /health OK within {args.startup_timeout} s; see {log.name}")
        time.sleep(0.02)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


async def one_request(client, model: str, prompt: list[int], max_tokens: int) -> RequestResult:
    t0 = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            stamps.append(time.perf_counter())
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    if not stamps:
        stamps = [end]
    return RequestResult(stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:])], end - t0, tokens)


async def run_load(base_url: str, model: str, work: list[tuple[list[int], int]], concurrency: int) -> RunResult:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    sem = asyncio.Semaphore(concurrency)

    async def limited(prompt: list[int], n: int) -> RequestResult:
        async with sem:
            return await one_request(client, model, prompt, n)

    t0 = time.perf_counter()
    results = await asyncio.gather(*(limited(p, n) for p, n in work))
    run = RunResult(time.perf_counter() - t0, list(results))
    await client.close()
    return run


def print_table(rows: dict[str, dict[str, float]]) -> None:
    keys = list(next(iter(rows.values())))
    print(f"{'':>26}" + "".join(f"{k:>14}" for k in keys))
    for name, row in rows.items():
        print(f"{name:>26}" + "".join(f"{row[k]:>14.2f}" for k in keys))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    ap.add_argument("-n", "--num-prompts", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=None, help="requests in flight (default: all)")
    ap.add_argument("--input-len", type=int, nargs=2, default=(32, 128), metavar=("MIN", "MAX"))
    ap.add_argument("--output-len", type=int, nargs=2, default=(32, 96), metavar=("MIN", "MAX"))
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--kv-cache-mib", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-sequential", action="store_true", help="no one-at-a-time baseline")
    ap.add_argument("--startup-only", action="store_true", help="only time start -> /health OK")
    ap.add_argument("--repeat", type=int, default=1, help="server starts to time with --startup-only")
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                    help="everything after this goes to forkless serve")
    args = ap.parse_args()

    log = tempfile.NamedTemporaryFile("wb", prefix="forkless-serve-", suffix=".log", delete=False)
    if args.startup_only:
        times = []
        for _ in range(args.repeat):
            proc, startup = start_server(args, free_port(), log)
            stop_server(proc)
            times.append(startup)
            print(f"start -> /health OK: {startup:.2f} s", flush=True)
        print(f"median {statistics.median(times):.2f} s over {len(times)} starts (target <= 10 s)")
        return

    port = free_port()
    proc, startup = start_server(args, port, log)
    print(f"start -> /health OK: {startup:.2f} s (target <= 10 s); server log {log.name}", flush=True)
    try:
        base = f"http://127.0.0.1:{port}/v1"
        model = httpx.get(base + "/models").json()["data"][0]["id"]
        rng = random.Random(args.seed)
        work = [([rng.randrange(100, 20000) for _ in range(rng.randint(*args.input_len))],
                 rng.randint(*args.output_len)) for _ in range(args.num_prompts)]
        asyncio.run(run_load(base, model, work[:2], 2))  # warm-up
        concurrency = args.concurrency or len(work)
        rows = {}
        conc = asyncio.run(run_load(base, model, work, concurrency))
        rows[f"concurrent ({concurrency})"] = conc.summary()
        if not args.skip_sequential:
            seq = asyncio.run(run_load(base, model, work, 1))
            rows["sequential (1)"] = seq.summary()
        print(f"{len(work)} requests, input {tuple(args.input_len)}, output {tuple(args.output_len)} tokens, "
              f"{sum(n for _, n in work)} output tokens")
        print_table(rows)
        if not args.skip_sequential:
            c, s = rows[f"concurrent ({concurrency})"], rows["sequential (1)"]
            print(f"ratio concurrent / sequential: output tok/s {c['out tok/s'] / s['out tok/s']:.2f}x, "
                  f"req/s {c['req/s'] / s['req/s']:.2f}x")
    finally:
        stop_server(proc)


if __name__ == "__main__":
    main()
