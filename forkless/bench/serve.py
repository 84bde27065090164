"""``forkless bench serve``: ``vllm bench serve``'s workload, metrics and result table.

Requests are streaming ``/v1/completions`` whose prompts are random token ids (so every
prompt is exactly its drawn length), sent over ``aiohttp`` (as vLLM's benchmark does) at a
Poisson (or gamma, with ``burstiness``) arrival rate, at most ``max_concurrency`` in
flight. The client must not be what limits the measurement: with hundreds of streams on
a fast GPU it reads ~20k SSE events a second, which ``httpx`` (~80 us of CPU an event,
measured) cannot, and ``aiohttp`` with ``msgspec`` parsing (~18 us) can. The metrics follow
vLLM's ``vllm/benchmarks/serve.py``:

* TTFT: request sent -> first chunk carrying text.
* ITL: the gaps between consecutive chunks carrying text (a chunk may carry several
  tokens; it is still one gap, as vLLM counts).
* E2EL: request sent -> last chunk carrying text.
* TPOT: ``(e2el - ttft) / (output tokens - 1)`` for requests of more than one token;
  output tokens are the server's ``usage.completion_tokens``.

The random dataset draws lengths as vLLM's ``RandomDataset`` does: input lengths
uniform over the integers in ``[floor(len * (1 - r)), ceil(len * (1 + r))]``, output
lengths likewise (at least 1), ``0 <= r < 1``.

The server helpers (:func:`start_server`, :func:`stop_server`) start and stop ``forkless
serve`` as a subprocess; ``benchmarks/hostile.py`` uses them too.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import httpx
import msgspec

#: ``--dataset-name`` values this benchmark has (vLLM has more).
DATASETS = ("random",)
#: ``--percentile-metrics`` names: (key, name in the table, section header).
METRICS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}
#: Token ids are drawn below this bound when the vocabulary size is unknown (ordinary
#: tokens in every tokenizer served here: special tokens sit at the ends of the vocabulary).
DEFAULT_VOCAB_BOUND = 32000
FIRST_ID = 100


# -------------------------------------------------------------------------- dataset


@dataclass(frozen=True)
class SampleRequest:
    """One request of the workload: token ids and how many tokens to ask for."""

    prompt: list[int]
    prompt_len: int
    expected_output_len: int


def length_bounds(length: int, range_ratio: float, at_least: int = 0) -> tuple[int, int]:
    """vLLM's inclusive sampling interval ``[floor(len*(1-r)), ceil(len*(1+r))]``."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    low = max(math.floor(length * (1 - range_ratio)), at_least)
    high = max(math.ceil(length * (1 + range_ratio)), at_least)
    return low, high


def random_requests(num_prompts: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                    vocab_size: int | None = None, seed: int = 0) -> list[SampleRequest]:
    """The ``random`` dataset: seeded, the same arguments give the same requests.

    Args:
        num_prompts: Number of requests.
        input_len: Mean prompt length in tokens.
        output_len: Mean output length in tokens (``max_tokens``).
        range_ratio: Lengths are uniform in ``[len*(1-r), len*(1+r)]`` (vLLM's meaning).
        vocab_size: Ids are drawn from ``[100, min(vocab_size, 32000))``; ``None``: ``32000``.
        seed: Seeds the lengths and the ids.
    """
    import numpy as np

    in_low, in_high = length_bounds(input_len, range_ratio, at_least=1)
    out_low, out_high = length_bounds(output_len, range_ratio, at_least=1)
    rng = np.random.default_rng(seed)
    input_lens = rng.integers(in_low, in_high + 1, size=num_prompts)
    output_lens = rng.integers(out_low, out_high + 1, size=num_prompts)
    top = min(vocab_size or DEFAULT_VOCAB_BOUND, DEFAULT_VOCAB_BOUND)
    first = FIRST_ID if top > 2 * FIRST_ID else 0
    return [SampleRequest(rng.integers(first, top, size=int(n)).tolist(), int(n), int(o))
            for n, o in zip(input_lens, output_lens)]


def arrival_times(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds after the start at which each request is sent (vLLM's ``get_request``).

    Gaps are gamma-distributed with shape ``burstiness`` and mean ``1 / request_rate``
    (``burstiness == 1``: a Poisson process), then scaled so that the last request goes
    out at ``n / request_rate``; ``request_rate == inf`` sends everything at once.
    """
    if request_rate <= 0 or burstiness <= 0:
        raise ValueError("request rate and burstiness must be > 0")
    if math.isinf(request_rate):
        return [0.0] * n
    import numpy as np

    rng = np.random.default_rng(seed)
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / request_rate)
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    times = np.cumsum(gaps)
    if n and times[-1] > 0:
        times *= (n / request_rate) / times[-1]
    return times.tolist()


# -------------------------------------------------------------------------- client


@dataclass
class RequestOutput:
    """What one streamed request measured (seconds, ``time.perf_counter`` clock)."""

    prompt_len: int
    success: bool = False
    error: str = ""
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0


_decode_event = msgspec.json.Decoder().decode


async def send_completion(session: aiohttp.ClientSession, url: str, model: str, req: SampleRequest,
                          ignore_eos: bool, extra_body: dict[str, Any]) -> RequestOutput:
    """One streaming completion, timed chunk by chunk as vLLM's ``openai`` backend does."""
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.expected_output_len, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos, **extra_body}
    out = RequestOutput(req.prompt_len)
    out.start_time = st = last = time.perf_counter()
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.read()).decode(errors='replace')[:500]}"
                return out
            # One SSE event per line ("data: {...}"), blank lines between them.
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    continue
                data = _decode_event(payload)
                now = time.perf_counter()
                choices = data.get("choices")
                if choices and choices[0].get("text"):
                    if not out.success:
                        out.success, out.ttft = True, now - st
                    else:
                        out.itl.append(now - last)
                    last = now
                if data.get("usage"):
                    out.output_tokens = data["usage"].get("completion_tokens") or 0
        if not out.success:
            out.error = "no chunk carried text"
        out.latency = last - st
    except (aiohttp.ClientError, asyncio.TimeoutError, msgspec.DecodeError, OSError) as exc:
        out.success, out.error = False, f"{type(exc).__name__}: {exc}"
    return out


@dataclass
class RunResult:
    """All requests' outputs and the benchmark's wall time."""

    outputs: list[RequestOutput]
    duration: float


async def run_requests(base_url: str, model: str, requests: list[SampleRequest], request_rate: float = math.inf,
                       burstiness: float = 1.0, max_concurrency: int | None = None, ignore_eos: bool = True,
                       seed: int = 0, extra_body: dict[str, Any] | None = None,
                       num_warmups: int = 0) -> RunResult:
    """Send ``requests`` at their arrival times, at most ``max_concurrency`` in flight."""
    url = base_url.rstrip("/") + "/v1/completions"
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    extra = extra_body or {}
    # No pool limit but the concurrency's (0: none), and no per-read timeout: a long
    # generation may be silent for a while under load; the whole run is bounded.
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=6 * 3600.0)

    # read_bufsize bounds one SSE line: a chunk with logprobs can be long.
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=1 << 20) as client:
        async def one(req: SampleRequest) -> RequestOutput:
            if sem is None:
                return await send_completion(client, url, model, req, ignore_eos, extra)
            async with sem:
                return await send_completion(client, url, model, req, ignore_eos, extra)

        if num_warmups:
            await asyncio.gather(*(one(requests[0]) for _ in range(num_warmups)))
        times = arrival_times(len(requests), request_rate, burstiness, seed)
        t0 = time.perf_counter()
        tasks = []
        for req, at in zip(requests, times):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(req)))
        outputs = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    return RunResult(list(outputs), duration)


# -------------------------------------------------------------------------- metrics


def _stats(values: list[float], percentiles: list[float], key: str) -> dict[str, float]:
    """``mean_/median_/std_/pXX_{key}_ms`` as vLLM writes them (numpy, linear percentiles)."""
    import numpy as np

    vals = np.asarray(values or [0.0]) * 1000
    out = {f"mean_{key}_ms": float(np.mean(vals)), f"median_{key}_ms": float(np.median(vals)),
           f"std_{key}_ms": float(np.std(vals))}
    for p in percentiles:
        out[f"p{_pword(p)}_{key}_ms"] = float(np.percentile(vals, p))
    return out


def _pword(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def calculate_metrics(run: RunResult, percentile_metrics: list[str], percentiles: list[float]) -> dict[str, Any]:
    """vLLM's result fields (``completed``, ``request_throughput``, ``mean_ttft_ms``, ...)."""
    ok = [o for o in run.outputs if o.success]
    dur = run.duration
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    per_metric = {
        "ttft": [o.ttft for o in ok],
        "tpot": [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1],
        "itl": [x for o in ok for x in o.itl],
        "e2el": [o.latency for o in ok],
    }
    result: dict[str, Any] = {
        "duration": dur, "completed": len(ok), "failed": len(run.outputs) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur, "request_goodput": None,
        "output_throughput": total_out / dur, "total_token_throughput": (total_in + total_out) / dur,
        "max_output_tokens_per_s": _peak_tokens_per_s(ok), "max_concurrent_requests": _peak_concurrency(ok),
    }
    for name in percentile_metrics:
        result |= _stats(per_metric[name], percentiles, name)
    result["errors"] = [o.error for o in run.outputs if not o.success]
    return result


def _peak_tokens_per_s(ok: list[RequestOutput]) -> float:
    """Most text chunks in any one-second bucket from the first request's start (vLLM's)."""
    if not ok:
        return 0.0
    t0 = min(o.start_time for o in ok)
    buckets: dict[int, int] = {}
    for o in ok:
        t = o.start_time + o.ttft
        for gap in [0.0, *o.itl]:
            t += gap
            buckets[int(t - t0)] = buckets.get(int(t - t0), 0) + 1
    return float(max(buckets.values()))


def _peak_concurrency(ok: list[RequestOutput]) -> int:
    """Most requests between their start and their last chunk at once (half-open intervals)."""
    events = sorted([(o.start_time, 1) for o in ok] + [(o.start_time + o.latency, -1) for o in ok])
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def format_result(result: dict[str, Any], percentile_metrics: list[str], percentiles: list[float],
                  max_concurrency: int | None, request_rate: float) -> str:
    """vLLM's "Serving Benchmark Result" table."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label: str, value: Any) -> None:
        fmt = "{:<40} {:<10.2f}" if isinstance(value, float) else "{:<40} {:<10}"
        lines.append(fmt.format(label, value))

    row("Successful requests:", result["completed"])
    row("Failed requests:", result["failed"])
    if max_concurrency is not None:
        row("Maximum request concurrency:", max_concurrency)
    if not math.isinf(request_rate):
        row("Request rate configured (RPS):", float(request_rate))
    row("Benchmark duration (s):", result["duration"])
    row("Total input tokens:", result["total_input_tokens"])
    row("Total generated tokens:", result["total_output_tokens"])
    row("Request throughput (req/s):", result["request_throughput"])
    row("Output token throughput (tok/s):", result["output_throughput"])
    row("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"])
    row("Peak concurrent requests:", float(result["max_concurrent_requests"]))
    row("Total Token throughput (tok/s):", result["total_token_throughput"])
    for key in METRICS:
        if key not in percentile_metrics:
            continue
        name, header = METRICS[key]
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        row(f"Mean {name} (ms):", result[f"mean_{key}_ms"])
        row(f"Median {name} (ms):", result[f"median_{key}_ms"])
        for p in percentiles:
            row(f"P{_pword(p)} {name} (ms):", result[f"p{_pword(p)}_{key}_ms"])
    lines.append("=" * 50)
    return "\n".join(lines)


def result_filename(model_id: str, request_rate: float, max_concurrency: int | None, date: str,
                    label: str | None = None) -> str:
    """vLLM's default name: ``{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json``."""
    conc = f"-concurrency{max_concurrency}" if max_concurrency is not None else ""
    return f"{label or 'openai'}-{request_rate}qps{conc}-{model_id.rstrip('/').split('/')[-1]}-{date}.json"


# -------------------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(serve_args: list[str], port: int, log: IO[bytes], timeout: float = 300,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen, float]:
    """Start ``forkless serve SERVE_ARGS --port PORT``; return it and the seconds to ``/health`` OK.

    Its output goes to ``log``; it runs in its own session so that :func:`stop_server`
    can kill the whole group. Raises ``SystemExit`` if it exits or is not healthy in time.
    """
    cmd = [sys.executable, "-m", "forkless.entrypoints.cli.main", "serve", *serve_args, "--port", str(port)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}/health"
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"forkless serve exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return proc, time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        if time.perf_counter() - t0 > timeout:
            stop_server(proc)
            raise SystemExit(f"no /health OK within {timeout} s; see {log.name}")
        time.sleep(0.02)


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL the process group after 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def served_model(base_url: str) -> str:
    """The first model id of ``/v1/models``."""
    return httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30).json()["data"][0]["id"]


def vocab_size_of(path: str | None) -> int | None:
    """``vocab_size`` of a local model folder's config.json, else ``None``."""
    if path and (Path(path) / "config.json").is_file():
        cfg = json.loads((Path(path) / "config.json").read_text())
        return cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
    return None
