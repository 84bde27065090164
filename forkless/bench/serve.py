"""``forkless bench serve``: ``vllm bench serve``'s workload, metrics and result table.

Invariants:
    * A ``vllm bench serve`` command line runs the same benchmark with ``vllm`` changed to
      ``forkless``, or fails before sending anything, naming the flag it does not support
      and why (:data:`UNSUPPORTED`; argparse's own error for a flag vLLM does not have
      either). Flag names, defaults, table rows and result-JSON keys are vLLM's.
    * Prompts are random token ids drawn here (so every prompt is exactly its drawn
      length, with no client-side tokenizer); only ``openai-chat``, whose messages are
      text, has the server decode them (``/detokenize``) before the run starts.
    * Nothing but the requests of the run is timed: the chat prompts' decoding, the ready
      check and the warm-ups come before the clock starts.

Requests are streaming ``/v1/completions`` (backends ``openai`` and ``vllm``, as vLLM's
both are) or ``/v1/chat/completions`` (``openai-chat``: the prompt as one user message),
sent over ``aiohttp`` (as vLLM's benchmark does) at a Poisson (or gamma, with
``burstiness``) arrival rate, or a rate ramped from ``--ramp-up-start-rps`` to
``--ramp-up-end-rps``, at most ``max_concurrency`` in flight. The client must not be what
limits the measurement: with hundreds of streams on a fast GPU it reads ~20k SSE events a
second, which ``httpx`` (~80 us of CPU an event, measured) cannot, and ``aiohttp`` with
``msgspec`` parsing (~18 us) can. The metrics follow vLLM's ``vllm/benchmarks/serve.py``:

* TTFT: request sent -> first chunk carrying text.
* ITL: the gaps between consecutive chunks carrying text (a chunk may carry several
  tokens; it is still one gap, as vLLM counts).
* E2EL: request sent -> last chunk carrying text.
* TPOT: ``(e2el - ttft) / (output tokens - 1)`` for requests of more than one token;
  output tokens are the server's ``usage.completion_tokens``, input tokens its
  ``usage.prompt_tokens`` (which, for chat, counts the chat template's tokens, as vLLM's).
* Request goodput (``--goodput ttft:MS tpot:MS e2el:MS``): requests a second that met
  every SLO given; a one-token request's TPOT counts as 0 (vLLM's rule).
* Client queue time (with ``--max-concurrency``): request due -> sent.

The random dataset draws lengths as vLLM's ``RandomDataset`` does: input lengths
uniform over the integers in ``[floor(len * (1 - r)), ceil(len * (1 + r))]``, output
lengths likewise (at least 1), ``0 <= r < 1``; ``--random-prefix-len P`` puts the same
``P`` random tokens before every prompt (``P`` + the drawn length in all).

The server helpers (:func:`start_server`, :func:`stop_server`) start and stop ``forkless
serve`` as a subprocess; ``benchmarks/hostile.py`` uses them too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import aiohttp
import httpx
import msgspec

#: ``--dataset-name`` values this benchmark has (vLLM has more).
DATASETS = ("random",)
#: ``--backend`` values: the path each posts to by default, and the ending vLLM requires
#: of ``--endpoint`` for it.
BACKENDS = {
    "openai": ("/v1/completions", "completions"),
    "vllm": ("/v1/completions", "completions"),
    "openai-chat": ("/v1/chat/completions", "chat/completions"),
}
#: ``--percentile-metrics`` names: (key, name in the table, section header). The last
#: two are reported only with ``--max-concurrency`` (and a finite rate, for the last).
METRICS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
    "client_queue_time": ("Client Queue Time", "Client-side Queueing"),
    "e2el_including_client_queue": ("E2EL incl. Client Queue", "Queue-inclusive End-to-end Latency"),
}
#: ``--goodput`` SLO names (milliseconds).
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
#: Per-request lists of the result JSON that only ``--save-detailed`` keeps (vLLM's list:
#: ``latencies`` and ``queue_times`` stay in every result, as in vLLM's).
DETAILED_KEYS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors")
#: vLLM ``bench serve`` flags this one refuses, and why (the parser turns each into an
#: error naming it; ``forkless bench serve --help`` lists them).
UNSUPPORTED = {
    "--dataset-path": "it reads a dataset file or Hugging Face dataset; only --dataset-name random is here",
    "--no-stream": "a Hugging Face dataset option; only --dataset-name random is here",
    "--no-oversample": "a file dataset option; only --dataset-name random is here",
    "--skip-chat-template": "a file dataset option; only --dataset-name random is here",
    "--disable-shuffle": "a file dataset option; only --dataset-name random is here",
    "--custom-output-len": "the custom dataset is not here (only --dataset-name random)",
    "--sharegpt-output-len": "the sharegpt dataset is not here (only --dataset-name random)",
    "--sonnet-input-len": "the sonnet dataset is not here (only --dataset-name random)",
    "--sonnet-output-len": "the sonnet dataset is not here (only --dataset-name random)",
    "--sonnet-prefix-len": "the sonnet dataset is not here (only --dataset-name random)",
    "--spec-bench-output-len": "the spec_bench dataset is not here (only --dataset-name random)",
    "--spec-bench-category": "the spec_bench dataset is not here (only --dataset-name random)",
    "--blazedit-min-distance": "the blazedit dataset is not here (only --dataset-name random)",
    "--blazedit-max-distance": "the blazedit dataset is not here (only --dataset-name random)",
    "--hf-subset": "Hugging Face datasets are not here (only --dataset-name random)",
    "--hf-split": "Hugging Face datasets are not here (only --dataset-name random)",
    "--hf-name": "Hugging Face datasets are not here (only --dataset-name random)",
    "--hf-output-len": "Hugging Face datasets are not here (only --dataset-name random)",
    "--txt-slices-input-len": "the txt-slices dataset is not here (only --dataset-name random)",
    "--txt-slices-output-len": "the txt-slices dataset is not here (only --dataset-name random)",
    "--prefix-repetition-prefix-len": "the prefix_repetition dataset is not here; --random-prefix-len "
                                      "gives every random prompt one shared prefix",
    "--prefix-repetition-suffix-len": "the prefix_repetition dataset is not here (only --dataset-name random)",
    "--prefix-repetition-num-prefixes": "the prefix_repetition dataset is not here (only --dataset-name random)",
    "--prefix-repetition-output-len": "the prefix_repetition dataset is not here (only --dataset-name random)",
    "--random-mm-base-items-per-request": "random-mm (multimodal) is not here: text generation only",
    "--random-mm-num-mm-items-range-ratio": "random-mm (multimodal) is not here: text generation only",
    "--random-mm-limit-mm-per-prompt": "random-mm (multimodal) is not here: text generation only",
    "--random-mm-bucket-config": "random-mm (multimodal) is not here: text generation only",
    "--no-reranker": "the rerank benchmark is not here: text generation only",
    "--self-timed": "it replays a timed_trace dataset's timestamps; only --dataset-name random is here",
    "--chat-template-kwargs": "it renders file datasets' prompts client-side; only --dataset-name random is here",
    "--skip-tokenizer-init": "prompts are random token ids and counts are the server's; there is no "
                             "client tokenizer to skip",
    "--probe-request-rate": "probe requests beside the workload are not implemented",
    "--profile": "forkless serve has no /start_profile and /stop_profile",
    "--insecure": "TLS verification cannot be turned off here",
    "--plot-timeline": "plots are not implemented (--save-detailed writes start_times, ttfts and itls)",
    "--timeline-itl-thresholds": "plots are not implemented (--save-detailed writes start_times, ttfts and itls)",
    "--plot-dataset-stats": "plots are not implemented (--save-detailed writes input_lens and output_lens)",
}
#: Token ids are drawn below this bound when the vocabulary size is unknown (ordinary
#: tokens in every tokenizer served here: special tokens sit at the ends of the vocabulary).
DEFAULT_VOCAB_BOUND = 32000
FIRST_ID = 100
#: Seconds between ``--ready-check-timeout-sec`` probes (vLLM's).
READY_RETRY_S = 5.0


# -------------------------------------------------------------------------- dataset


@dataclass(frozen=True)
class SampleRequest:
    """One request of the workload: token ids and how many tokens to ask for.

    ``text`` is the prompt decoded by the server, for backends that send text (chat);
    ``request_id`` goes out as the ``x-request-id`` header (``None``: none is sent).
    """

    prompt: list[int]
    prompt_len: int
    expected_output_len: int
    request_id: str | None = None
    text: str | None = None


def length_bounds(length: int, range_ratio: float, at_least: int = 0) -> tuple[int, int]:
    """vLLM's inclusive sampling interval ``[floor(len*(1-r)), ceil(len*(1+r))]``."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    low = max(math.floor(length * (1 - range_ratio)), at_least)
    high = max(math.ceil(length * (1 + range_ratio)), at_least)
    return low, high


def random_requests(num_prompts: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                    vocab_size: int | None = None, seed: int = 0, prefix_len: int = 0,
                    request_id_prefix: str | None = None) -> list[SampleRequest]:
    """The ``random`` dataset: seeded, the same arguments give the same requests.

    Args:
        num_prompts: Number of requests.
        input_len: Mean length in tokens of the prompt after the prefix.
        output_len: Mean output length in tokens (``max_tokens``).
        range_ratio: Lengths are uniform in ``[len*(1-r), len*(1+r)]`` (vLLM's meaning).
        vocab_size: Ids are drawn from ``[100, min(vocab_size, 32000))``; ``None``: ``32000``.
        seed: Seeds the lengths and the ids.
        prefix_len: This many random tokens, drawn once, open every prompt (vLLM's
            ``--random-prefix-len``); the range ratio does not apply to them.
        request_id_prefix: Request ``i`` gets the id ``f"{request_id_prefix}{i}"`` (vLLM's);
            ``None``: no ids.
    """
    import numpy as np

    in_low, in_high = length_bounds(input_len, range_ratio, at_least=0 if prefix_len else 1)
    out_low, out_high = length_bounds(output_len, range_ratio, at_least=1)
    rng = np.random.default_rng(seed)
    input_lens = rng.integers(in_low, in_high + 1, size=num_prompts)
    output_lens = rng.integers(out_low, out_high + 1, size=num_prompts)
    top = min(vocab_size or DEFAULT_VOCAB_BOUND, DEFAULT_VOCAB_BOUND)
    first = FIRST_ID if top > 2 * FIRST_ID else 0
    # Drawn only when asked for, so that a run without a prefix draws what it always drew.
    prefix = rng.integers(first, top, size=prefix_len).tolist() if prefix_len else []
    return [SampleRequest(prefix + rng.integers(first, top, size=int(n)).tolist(), prefix_len + int(n), int(o),
                          None if request_id_prefix is None else f"{request_id_prefix}{i}")
            for i, (n, o) in enumerate(zip(input_lens, output_lens))]


def lora_names(modules: list[str], n: int, assignment: str = "random", seed: int = 0) -> list[str]:
    """Each request's ``model`` field under vLLM's ``--lora-modules``: one of ``modules``
    at random (seeded) or in turn (``round-robin``)."""
    if assignment == "round-robin":
        return [modules[i % len(modules)] for i in range(n)]
    rng = random.Random(seed)
    return [rng.choice(modules) for _ in range(n)]


def request_rates(n: int, request_rate: float, ramp_up: tuple[str, int, int] | None = None) -> list[float]:
    """The rate (requests/s) in force when each request is due (vLLM's ramp-up).

    Without ``ramp_up`` every request has ``request_rate``. With ``(strategy, start, end)``
    request ``i`` of ``n`` has, at progress ``p = i / max(n - 1, 1)``, ``start + (end -
    start) * p`` (``linear``) or ``start * (end / start) ** p`` (``exponential``).
    """
    if ramp_up is None:
        return [request_rate] * n
    strategy, start, end = ramp_up
    rates = []
    for i in range(n):
        progress = i / max(n - 1, 1)
        if strategy == "linear":
            rates.append(start + (end - start) * progress)
        elif strategy == "exponential":
            rates.append(start * (end / start) ** progress)
        else:
            raise ValueError(f"unknown ramp-up strategy {strategy!r}; choose linear or exponential")
    return rates


def arrival_times(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0,
                  ramp_up: tuple[str, int, int] | None = None) -> list[float]:
    """Seconds after the start at which each request is sent (vLLM's ``get_request``).

    Each gap is gamma-distributed with shape ``burstiness`` and mean ``1 / rate``, the
    rate in force for that request (:func:`request_rates`; ``burstiness == 1``: a Poisson
    process; ``inf``: exactly ``1 / rate``). At a constant rate the times are then scaled
    so that the last request goes out at ``n / request_rate`` (vLLM's; a ramp is not
    scaled); ``request_rate == inf`` sends everything at once.
    """
    if request_rate <= 0 or burstiness <= 0:
        raise ValueError("request rate and burstiness must be > 0")
    rates = request_rates(n, request_rate, ramp_up)
    if any(r <= 0 for r in rates):
        raise ValueError(f"a ramp-up rate of {min(rates)} requests/s: every request's rate must be > 0")
    if ramp_up is None and math.isinf(request_rate):
        return [0.0] * n
    import numpy as np

    rng = np.random.default_rng(seed)
    per = np.asarray(rates, dtype=float)
    if math.isinf(burstiness):
        gaps = 1.0 / per
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (per * burstiness), size=n)
    times = np.cumsum(gaps)
    if ramp_up is None and n and times[-1] > 0:
        times *= (n / request_rate) / times[-1]
    return times.tolist()


# -------------------------------------------------------------------------- client


@dataclass
class RequestOutput:
    """What one streamed request measured (seconds, ``time.perf_counter`` clock).

    ``prompt_len`` is the server's ``usage.prompt_tokens`` when it reports it, else the
    drawn length. ``queue_time`` is how long the request waited, due, for a
    ``--max-concurrency`` slot (vLLM's ``client_queue_time``).
    """

    prompt_len: int
    success: bool = False
    error: str = ""
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    queue_time: float = 0.0
    generated_text: str = ""


_decode_event = msgspec.json.Decoder().decode


@dataclass(frozen=True)
class RequestOptions:
    """What every request of a run shares (vLLM's ``RequestFuncInput`` less the prompt).

    Attributes:
        url: The full URL posted to (base URL + endpoint).
        model: The ``model`` field (``--served-model-name``, else the model).
        chat: Post a chat completion (``messages``), not a completion (``prompt``).
        ignore_eos: Sent when true.
        logprobs: ``--logprobs``: sent with completions when given (vLLM's ``openai-chat``
            does not send it either).
        extra_body: Sampling parameters given and ``--extra-body``, merged into every body.
        headers: Extra HTTP headers (``--header``, ``OPENAI_API_KEY``'s ``Authorization``).
    """

    url: str
    model: str
    chat: bool = False
    ignore_eos: bool = True
    logprobs: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def request_headers(extra: dict[str, str] | None) -> dict[str, str]:
    """vLLM's headers: ``Authorization: Bearer $OPENAI_API_KEY`` if set, then ``--header``'s."""
    headers = {}
    # vLLM's client reads the OpenAI variable, not a forkless one: ported scripts set it.
    if key := os.environ.get("OPENAI_API_KEY"):
        headers["Authorization"] = f"Bearer {key}"
    return headers | (extra or {})


def request_body(opts: RequestOptions, req: SampleRequest, model: str | None = None) -> dict[str, Any]:
    """The JSON body vLLM's request function builds for ``req``."""
    body: dict[str, Any] = {"model": model or opts.model}
    if opts.chat:
        # vLLM's openai-chat: the prompt as one user message of one text part.
        body["messages"] = [{"role": "user", "content": [{"type": "text", "text": req.text}]}]
        body["max_completion_tokens"] = req.expected_output_len
    else:
        body["prompt"] = req.prompt
        body["max_tokens"] = req.expected_output_len
        if opts.logprobs is not None:
            body["logprobs"] = opts.logprobs
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if opts.ignore_eos:
        body["ignore_eos"] = True
    return body | opts.extra_body


async def send_request(session: aiohttp.ClientSession, opts: RequestOptions, req: SampleRequest,
                       model: str | None = None) -> RequestOutput:
    """One streaming request, timed chunk by chunk as vLLM's request functions do."""
    body = request_body(opts, req, model)
    headers = dict(opts.headers)
    if req.request_id is not None:
        headers["x-request-id"] = req.request_id
    out = RequestOutput(req.prompt_len)
    text: list[str] = []
    out.start_time = st = last = time.perf_counter()
    try:
        async with session.post(opts.url, json=body, headers=headers) as resp:
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
                if choices:
                    if opts.chat:
                        delta = choices[0].get("delta") or {}
                        piece = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                    else:
                        piece = choices[0].get("text")
                    if piece:
                        if not out.success:
                            out.success, out.ttft = True, now - st
                        else:
                            out.itl.append(now - last)
                        last = now
                        text.append(piece)
                if usage := data.get("usage"):
                    out.output_tokens = usage.get("completion_tokens") or 0
                    if usage.get("prompt_tokens") is not None:
                        out.prompt_len = usage["prompt_tokens"]
        if not out.success:
            out.error = "no chunk carried text"
        out.latency = last - st
        out.generated_text = "".join(text)
    except (aiohttp.ClientError, asyncio.TimeoutError, msgspec.DecodeError, OSError) as exc:
        out.success, out.error = False, f"{type(exc).__name__}: {exc}"
    return out


async def decode_prompts(session: aiohttp.ClientSession, base_url: str, model: str, requests: list[SampleRequest],
                         headers: dict[str, str]) -> list[SampleRequest]:
    """``requests`` with ``text``: each prompt's ids decoded by the server's ``/detokenize``.

    Chat messages are text, and this client holds no tokenizer: the server's decoding is
    the one its chat template then re-encodes.
    """
    sem = asyncio.Semaphore(64)
    url = base_url.rstrip("/") + "/detokenize"

    async def one(req: SampleRequest) -> SampleRequest:
        async with sem, session.post(url, json={"model": model, "tokens": req.prompt}, headers=headers) as resp:
            if resp.status != 200:
                raise SystemExit(f"forkless bench serve: openai-chat sends text, and {url} did not decode the "
                                 f"random prompt (HTTP {resp.status}: {(await resp.text())[:300]})")
            return dataclasses.replace(req, text=(await resp.json())["prompt"])

    return list(await asyncio.gather(*(one(r) for r in requests)))


@dataclass
class RunResult:
    """All requests' outputs, the benchmark's wall time and, with a ramp-up, the moments
    each whole rate was first reached (vLLM's ``rps_change_events``)."""

    outputs: list[RequestOutput]
    duration: float
    rps_change_events: list[dict[str, Any]] = field(default_factory=list)


async def wait_for_endpoint(session: aiohttp.ClientSession, opts: RequestOptions, req: SampleRequest,
                            timeout: float) -> RequestOutput:
    """vLLM's ready check: send ``req`` every :data:`READY_RETRY_S` s until it succeeds or
    ``timeout`` s have passed; the last output (its ``error`` says why it failed)."""
    deadline = time.perf_counter() + timeout
    out = RequestOutput(req.prompt_len, error=f"Endpoint readiness timed out after {timeout:g}s.")
    while (left := deadline - time.perf_counter()) > 0:
        try:
            out = await asyncio.wait_for(send_request(session, opts, req), left)
        except asyncio.TimeoutError:
            break
        if out.success:
            return out
        await asyncio.sleep(min(READY_RETRY_S, max(0.0, deadline - time.perf_counter())))
    return out


async def run_requests(base_url: str, model: str, requests: list[SampleRequest], request_rate: float = math.inf,
                       burstiness: float = 1.0, max_concurrency: int | None = None, ignore_eos: bool = True,
                       seed: int = 0, extra_body: dict[str, Any] | None = None, num_warmups: int = 0, *,
                       backend: str = "openai", endpoint: str | None = None, headers: dict[str, str] | None = None,
                       logprobs: int | None = None, ramp_up: tuple[str, int, int] | None = None,
                       model_names: list[str] | None = None, progress: bool = False,
                       ready_check_timeout: float = 0) -> RunResult:
    """Send ``requests`` at their arrival times, at most ``max_concurrency`` in flight.

    Args:
        base_url: The server, without ``/v1``.
        model: The ``model`` field of every request (but see ``model_names``).
        requests: The workload.
        request_rate: Requests/s (``inf``: all at once); ignored with ``ramp_up``.
        burstiness: Gamma shape of the arrival gaps.
        max_concurrency: Most requests in flight (``None``: no limit).
        ignore_eos: Send ``ignore_eos``.
        seed: Seeds the arrival gaps.
        extra_body: Merged into every body (sampling parameters, ``--extra-body``).
        num_warmups: Requests (the first prompt, no request id) sent before the clock starts.
        backend: A :data:`BACKENDS` name.
        endpoint: The path posted to; ``None``: the backend's.
        headers: Extra HTTP headers of every request.
        logprobs: Completions' ``logprobs``.
        ramp_up: ``(strategy, start rps, end rps)``, see :func:`request_rates`.
        model_names: Request ``i``'s ``model`` field (``--lora-modules``); ``None``: ``model``.
        progress: Show a tqdm bar over the requests (on stderr).
        ready_check_timeout: > 0: first wait up to this many seconds for the first prompt
            to succeed (vLLM's ``--ready-check-timeout-sec``); ``SystemExit`` if it does not.
    """
    chat = backend == "openai-chat"
    opts = RequestOptions(base_url.rstrip("/") + (endpoint or BACKENDS[backend][0]), model, chat, ignore_eos,
                          logprobs, dict(extra_body or {}), request_headers(headers))
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    # No pool limit but the concurrency's (0: none), and no per-read timeout: a long
    # generation may be silent for a while under load; the whole run is bounded.
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=6 * 3600.0)

    # read_bufsize bounds one SSE line: a chunk with logprobs can be long.
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=1 << 20) as client:
        if chat:
            requests = await decode_prompts(client, base_url, model, requests, opts.headers)
        # The ready check and warm-ups send the first prompt without its request id (vLLM's).
        probe = dataclasses.replace(requests[0], request_id=None)
        if ready_check_timeout > 0:
            print("Starting initial single prompt test run...", flush=True)
            out = await wait_for_endpoint(client, opts, probe, ready_check_timeout)
            if not out.success:
                raise SystemExit("forkless bench serve: initial test run failed - please make sure benchmark "
                                 f"arguments are correctly specified. Error: {out.error}")
            print("Initial test run completed.", flush=True)
        bar = None

        async def one(req: SampleRequest, due: float, name: str | None) -> RequestOutput:
            if sem is None:
                out = await send_request(client, opts, req, name)
            else:
                async with sem:
                    out = await send_request(client, opts, req, name)
            out.queue_time = out.start_time - due
            if bar is not None:
                bar.update(1)
            return out

        if num_warmups:
            await asyncio.gather(*(one(probe, time.perf_counter(), None) for _ in range(num_warmups)))
        times = arrival_times(len(requests), request_rate, burstiness, seed, ramp_up)
        rates = request_rates(len(requests), request_rate, ramp_up)
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(requests), file=sys.stderr)
        events: list[dict[str, Any]] = []
        last_rps = -1
        if ramp_up is not None:
            last_rps = ramp_up[1]
            events.append({"rps": last_rps, "timestamp": datetime.now().isoformat()})
        t0 = time.perf_counter()
        tasks = []
        for i, (req, at) in enumerate(zip(requests, times)):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if ramp_up is not None and int(rates[i]) > last_rps:
                stamp = datetime.now().isoformat()
                events += [{"rps": r, "timestamp": stamp} for r in range(last_rps + 1, int(rates[i]) + 1)]
                last_rps = int(rates[i])
            tasks.append(asyncio.create_task(one(req, time.perf_counter(), model_names[i] if model_names else None)))
        outputs = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        if bar is not None:
            bar.close()
    return RunResult(list(outputs), duration, events)


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


def parse_goodput(pairs: list[str]) -> dict[str, float]:
    """``["ttft:100", "e2el:2000"]`` -> ``{"ttft": 100.0, "e2el": 2000.0}`` (ms), checked as vLLM does."""
    slos = {}
    for pair in pairs:
        try:
            name, value = pair.split(":")
            slos[name] = float(value)
        except ValueError:
            raise ValueError('Invalid format found for service level objectives. Specify service level '
                             'objectives for goodput as "KEY:VALUE" pairs, where the key is a metric name, '
                             f'and the value is a number in milliseconds (got {pair!r}).') from None
    for name, value in slos.items():
        if name not in GOODPUT_METRICS:
            raise ValueError(f"Invalid metric name found, {name}: {value:g}. The service level objective name "
                             f"should be one of {list(GOODPUT_METRICS)}.")
        if value < 0:
            raise ValueError(f"Invalid value found, {name}: {value:g}. The service level objective value should "
                             "be non-negative.")
    return slos


def calculate_metrics(run: RunResult, percentile_metrics: list[str], percentiles: list[float],
                      goodput: dict[str, float] | None = None, max_concurrency: int | None = None,
                      request_rate: float = math.inf) -> dict[str, Any]:
    """vLLM's result fields (``completed``, ``request_throughput``, ``mean_ttft_ms``, ...).

    The per-request lists (:data:`DETAILED_KEYS`, ``latencies``, ``queue_times``) cover
    every request, failed ones included, in the order sent, as vLLM's do.
    """
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
    # vLLM reports the client's queueing only where there is one: under a concurrency limit
    # (and, for the queue-inclusive latency, a finite rate).
    if max_concurrency is not None:
        per_metric["client_queue_time"] = [o.queue_time for o in ok]
        if not math.isinf(request_rate):
            per_metric["e2el_including_client_queue"] = [o.latency + o.queue_time for o in ok]
    good = None
    if goodput:
        # A request of one token has no TPOT; vLLM counts it as 0 against the SLO.
        good = sum(all(slo / 1000 >= value for slo, value in
                       ((goodput[k], {"ttft": o.ttft, "e2el": o.latency,
                                      "tpot": (o.latency - o.ttft) / (o.output_tokens - 1)
                                      if o.output_tokens > 1 else 0.0}[k]) for k in goodput))
                   for o in ok)
    result: dict[str, Any] = {
        "duration": dur, "completed": len(ok), "failed": len(run.outputs) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur, "request_goodput": None if good is None else good / dur,
        "output_throughput": total_out / dur, "total_token_throughput": (total_in + total_out) / dur,
        "input_lens": [o.prompt_len for o in run.outputs],
        "output_lens": [o.output_tokens if o.success else 0 for o in run.outputs],
        "ttfts": [o.ttft for o in run.outputs], "itls": [o.itl for o in run.outputs],
        "latencies": [o.latency for o in run.outputs], "start_times": [o.start_time for o in run.outputs],
        "queue_times": [o.queue_time for o in run.outputs],
        "generated_texts": [o.generated_text for o in run.outputs], "errors": [o.error for o in run.outputs],
        "max_output_tokens_per_s": _peak_tokens_per_s(ok), "max_concurrent_requests": _peak_concurrency(ok),
    }
    if run.rps_change_events:
        result["rps_change_events"] = run.rps_change_events
    for name in percentile_metrics:
        if name in per_metric:
            result |= _stats(per_metric[name], percentiles, name)
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
    if result.get("request_goodput") is not None:
        row("Request goodput (req/s):", result["request_goodput"])
    row("Output token throughput (tok/s):", result["output_throughput"])
    row("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"])
    row("Peak concurrent requests:", float(result["max_concurrent_requests"]))
    row("Total Token throughput (tok/s):", result["total_token_throughput"])
    for key in METRICS:
        # The client-queue metrics exist only under a concurrency limit (calculate_metrics).
        if key not in percentile_metrics or f"mean_{key}_ms" not in result:
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
                    label: str | None = None, backend: str = "openai",
                    ramp_up: tuple[str, int, int] | None = None) -> str:
    """vLLM's default name: ``{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json``, with
    ``{label}-ramp-up-{strategy}-{start}qps-{end}qps...`` for a ramp; the label defaults to
    the backend."""
    conc = f"-concurrency{max_concurrency}" if max_concurrency is not None else ""
    rate = f"ramp-up-{ramp_up[0]}-{ramp_up[1]}qps-{ramp_up[2]}qps" if ramp_up else f"{request_rate}qps"
    return f"{label or backend}-{rate}{conc}-{model_id.rstrip('/').split('/')[-1]}-{date}.json"


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


def served_model(base_url: str, headers: dict[str, str] | None = None) -> str:
    """The first model id of ``/v1/models`` (asked with the requests' headers: a server with
    ``--api-key`` wants them there too)."""
    resp = httpx.get(base_url.rstrip("/") + "/v1/models", headers=request_headers(headers), timeout=30)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


def vocab_size_of(path: str | None) -> int | None:
    """``vocab_size`` of a local model folder's config.json, else ``None``."""
    if path and (Path(path) / "config.json").is_file():
        cfg = json.loads((Path(path) / "config.json").read_text())
        return cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
    return None
