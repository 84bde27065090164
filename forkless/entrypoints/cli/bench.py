"""``forkless bench throughput|latency|serve``: the benchmarks from the command line.

``throughput`` runs the workload of ``forkless.bench.throughput`` (the same as
``benchmarks/throughput.py``) through forkless and through transformers ``generate`` in
the same run and prints both rates and their ratio, and the workload's hardware floor
(``forkless.bench.floor``) next to the measured time; ``latency`` times batch-1 decode
against the memory-bandwidth bound. ``--shape`` writes a model folder of a known shape
(with ``--load-format dummy`` no weights are needed). ``serve`` is ``vllm bench serve``
with its flag names, defaults, result table and JSON (``forkless.bench.serve``; a vLLM
flag it lacks is an error naming it), against ``--base-url`` (or ``--host`` / ``--port``)
or, with none of them, a ``forkless serve`` it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from forkless.config import EngineArgs
from forkless.entrypoints.cli.arg_types import port_number, positive_int


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench`` and its sub-commands."""
    parser = subparsers.add_parser("bench", help="benchmark forkless",
                                   description="Benchmarks: the offline engine's throughput and batch-1 latency, "
                                               "and online serving (see benchmarks/README.md).")
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)

    tp = sub.add_parser("throughput", help="output tokens/s against transformers generate")
    _common(tp)
    tp.add_argument("-n", "--num-prompts", type=positive_int, default=512)
    tp.add_argument("--input-len", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                    help="prompt lengths, uniform in [MIN, MAX] (default 100 1024)")
    tp.add_argument("--output-len", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                    help="output lengths, uniform in [MIN, MAX] (default 100 1024)")
    tp.add_argument("--workload-seed", type=int, default=0, help="seeds the random lengths and ids")
    same = tp.add_argument_group(
        "bench serve's workload", "the random dataset of `forkless bench serve` (vLLM's flags and lengths): with "
        "these, the requests are those `bench serve` sends with the same flags and --seed equal to "
        "--workload-seed, so that the server and the offline engine run the same work")
    same.add_argument("--random-input-len", type=int, default=None)
    same.add_argument("--random-output-len", type=int, default=None)
    same.add_argument("--random-range-ratio", type=float, default=0.0)
    tp.add_argument("--hf-batch-size", type=int, default=64, help="static batch size of the baseline")
    tp.add_argument("--hf-max-batches", type=int, default=None,
                    help="run only the first N baseline batches (its rate, not its total, is compared)")
    tp.add_argument("--skip-hf", action="store_true", help="forkless only")
    tp.add_argument("--peak-tflops", type=float, default=None,
                    help="peak FLOP/s (in TFLOP/s) for the floor's prefill compute (default: the "
                         "device's data-sheet dense bf16 number; on the CPU a matmul measured in the run)")
    tp.set_defaults(func=_one_line_errors("throughput", run_throughput))

    lat = sub.add_parser("latency", help="batch-1 time per output token against the bandwidth bound")
    _common(lat)
    lat.add_argument("--prompt-len", type=positive_int, default=128)
    lat.add_argument("--output-len", type=positive_int, default=256)
    lat.set_defaults(func=_one_line_errors("latency", run_latency))

    _add_serve(sub)
    return parser


def _one_line_errors(name: str, run: Any) -> Any:
    """``run(args)``, with a model that is not there or a bad engine flag reported as
    ``serve`` reports them: one line, exit status 2 (not a traceback)."""
    from forkless.model_loader.default_model import ModelNotFoundError

    def checked(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (ValueError, ModelNotFoundError) as exc:
            print(f"forkless bench {name}: error: {exc}", file=sys.stderr)
            return 2

    return checked


def _common(parser: argparse.ArgumentParser) -> None:
    EngineArgs.add_cli_args(parser, model_positional=False)
    parser.add_argument("--shape", default=None, help="write a model folder of this shape (qwen3-0.6b, llama3-8b)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")


def _model(args: argparse.Namespace, tmp: str) -> str:
    if args.shape:
        from forkless.bench.shapes import write_model_folder

        dtype = args.dtype if args.dtype != "auto" else "bfloat16"
        return str(write_model_folder(Path(tmp) / args.shape, args.shape, dtype=dtype))
    if args.model is None:
        from forkless.model_loader.default_model import default_model_path

        return str(default_model_path())
    return args.model


def _engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs = vars(EngineArgs.from_cli_args(args))
    kwargs.pop("model")
    return kwargs


def _emit(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _dtype(args: argparse.Namespace, config: dict[str, Any], device_type: str) -> str:
    """The dtype the engine runs (``auto``: float32 on the CPU, the config's elsewhere)."""
    if args.dtype != "auto":
        return args.dtype
    if device_type == "cpu":
        return "float32"
    name = str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")
    return name if name in DTYPE_BYTES else "float32"


def run_throughput(args: argparse.Namespace) -> int:
    from forkless.bench.floor import describe, kv_dtype_bytes, load_shape, peak_flops, throughput_floor
    from forkless.bench.latency import copy_bandwidth
    from forkless.bench.throughput import run_forkless, run_transformers
    from forkless.platforms import current_platform

    with tempfile.TemporaryDirectory() as tmp:
        model = _model(args, tmp)
        config = json.loads((Path(model) / "config.json").read_text())
        work, lengths = _workload(args, config["vocab_size"])
        kwargs = _engine_kwargs(args)
        if args.max_model_len is None:
            kwargs.pop("max_model_len")
        device_type = current_platform.device_type
        device = str(current_platform.torch_device())
        dtype = _dtype(args, config, device_type)
        print(f"model={args.shape or model} n={len(work)} {lengths} dtype={args.dtype} "
              f"load_format={args.load_format}", flush=True)
        # The floor's measurements run before the engine holds the device's memory.
        bandwidth = copy_bandwidth(device)
        bw_source = "device copy, measured now" if device_type != "cpu" else "CPU memory copy, measured now"
        flops, flops_source = peak_flops(device_type, args.peak_tflops, dtype)
        # The KV element size apart from the weights' (1 byte with --kv-cache-dtype fp8).
        width = DTYPE_BYTES[dtype]
        shape = load_shape(model, width, kv_dtype_bytes(args.kv_cache_dtype, width))
        floor = throughput_floor(shape, [(len(p), o) for p, o in work],
                                 args.max_num_seqs, bandwidth, flops)
        for line in describe(floor, bw_source, flops_source, args.max_num_seqs):
            print(line, flush=True)
        fk = run_forkless(model, work, **kwargs)
        print(f"forkless:     {fk.tokens} tokens in {fk.seconds:7.2f} s = {fk.tokens_per_s:9.1f} output tok/s",
              flush=True)
        print(f"forkless / floor: {fk.seconds / floor.seconds:.2f}x the floor's time "
              f"({fk.seconds:.2f} s against {floor.seconds:.2f} s)", flush=True)
        result: dict[str, Any] = {"forkless": vars(fk) | {"tokens_per_s": fk.tokens_per_s}}
        result["floor"] = vars(floor) | {"seconds": floor.seconds, "memory_seconds": floor.memory_seconds,
                                         "compute_seconds": floor.compute_seconds,
                                         "tokens_per_s": floor.tokens_per_s, "ratio": fk.seconds / floor.seconds,
                                         "bandwidth_source": bw_source, "peak_flops_source": flops_source}
        if not args.skip_hf:
            hf = run_transformers(model, work, args.hf_batch_size, dtype=dtype, device=device,
                                  max_batches=args.hf_max_batches, load_format=args.load_format)
            ratio = fk.tokens_per_s / hf.tokens_per_s
            print(f"transformers: {hf.tokens} tokens in {hf.seconds:7.2f} s = {hf.tokens_per_s:9.1f} output tok/s "
                  f"({hf.requests} requests, static batches of {args.hf_batch_size})")
            print(f"ratio forkless / transformers: {ratio:.1f}x")
            result["transformers"] = vars(hf) | {"tokens_per_s": hf.tokens_per_s}
            result["ratio"] = ratio
        _emit(args, result)
    return 0


def _workload(args: argparse.Namespace, vocab_size: int) -> tuple[list[tuple[list[int], int]], str]:
    """``bench throughput``'s requests (prompt ids, output length) and how they were drawn."""
    from forkless.bench.throughput import make_workload

    serve_like = (args.random_input_len, args.random_output_len)
    if serve_like == (None, None):
        input_len, output_len = tuple(args.input_len or (100, 1024)), tuple(args.output_len or (100, 1024))
        work = make_workload(args.num_prompts, input_len, output_len, vocab_size, args.workload_seed)
        return work, f"input={list(input_len)} output={list(output_len)}"
    from forkless.bench.serve import random_requests

    if None in serve_like:
        raise SystemExit("forkless bench throughput: --random-input-len and --random-output-len go together")
    if args.input_len is not None or args.output_len is not None:
        raise SystemExit("forkless bench throughput: --input-len / --output-len draw another workload than "
                         "--random-input-len / --random-output-len: give one pair")
    for flag, value in zip(("--random-input-len", "--random-output-len"), serve_like):
        if value < 1:
            raise SystemExit(f"forkless bench throughput: {flag}={value}: expected an integer >= 1")
    try:
        requests = random_requests(args.num_prompts, args.random_input_len, args.random_output_len,
                                   args.random_range_ratio, vocab_size, args.workload_seed)
    except ValueError as exc:  # the range ratio, named
        raise SystemExit(f"forkless bench throughput: {exc}") from None
    return ([(r.prompt, r.expected_output_len) for r in requests],
            f"random (bench serve's) input={args.random_input_len} output={args.random_output_len} "
            f"range_ratio={args.random_range_ratio} seed={args.workload_seed}")


def run_latency(args: argparse.Namespace) -> int:
    from forkless.bench.latency import copy_bandwidth, run_latency as latency
    from forkless.platforms import current_platform

    with tempfile.TemporaryDirectory() as tmp:
        model = _model(args, tmp)
        kwargs = _engine_kwargs(args)
        kwargs.pop("max_num_seqs")  # batch 1 by definition
        if kwargs.get("max_model_len") is None:
            kwargs["max_model_len"] = args.prompt_len + args.output_len + 16
        bandwidth = copy_bandwidth(str(current_platform.torch_device()))
        res = latency(model, args.prompt_len, args.output_len, **kwargs)
        weight_bytes = _weight_bytes(model, args.dtype)
        bound_ms = weight_bytes / bandwidth * 1e3
        print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; weights {weight_bytes / 1e9:.2f} GB; "
              f"bound {bound_ms:.2f} ms/token")
        print(f"forkless: {res.ms_per_token:.2f} ms/token (prompt {res.prompt_len}, {res.output_len} tokens) "
              f"= {res.ms_per_token / bound_ms:.2f}x the bound")
        _emit(args, {"ms_per_token": res.ms_per_token, "bound_ms": bound_ms, "bandwidth": bandwidth,
                     "weight_bytes": weight_bytes, "ratio": res.ms_per_token / bound_ms})
    return 0


def _weight_bytes(model: str, dtype: str) -> int:
    """Parameter bytes of the model (counted on the meta device, no memory used)."""
    from forkless.bench.floor import count_parameters

    if dtype == "auto":
        config = json.loads((Path(model) / "config.json").read_text())
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")
    return count_parameters(model) * DTYPE_BYTES.get(dtype, 4)


# -------------------------------------------------------------------------- serve


#: vLLM's backends that are not generation over the OpenAI API (audio, pooling, rerank).
_OTHER_BACKENDS = ("openai-audio", "openai-embeddings", "openai-embeddings-chat", "openai-embeddings-clip",
                   "openai-embeddings-vlm2vec", "infinity-embeddings", "infinity-embeddings-clip", "vllm-pooling",
                   "vllm-rerank")


def _dataset(value: str) -> str:
    from forkless.bench.serve import DATASETS

    if value not in DATASETS:
        raise argparse.ArgumentTypeError(
            f"unknown dataset {value!r}; forkless bench serve has: {', '.join(DATASETS)} (vLLM's sharegpt, custom, "
            "sonnet, hf, ... read dataset files or the Hugging Face Hub, which this benchmark does not)")
    return value


def _backend(value: str) -> str:
    from forkless.bench.serve import BACKENDS

    if value not in BACKENDS:
        why = (" is vLLM's audio / pooling / rerank benchmark" if value in _OTHER_BACKENDS else " is unknown")
        raise argparse.ArgumentTypeError(f"backend {value!r}{why}; forkless bench serve benchmarks text "
                                         f"generation: {', '.join(BACKENDS)}")
    return value


def _rate(value: str) -> float:
    rate = float(value)
    if not rate > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 requests/s (or inf for all at once), got {value}")
    return rate


def _positive(kind: type) -> Any:
    def parse(value: str) -> Any:
        number = kind(value)
        if not number > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
        return number
    return parse


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def _ratio(value: str) -> float:
    ratio = float(value)
    if not 0.0 <= ratio < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return ratio


def _csv_choice(value: str) -> list[str]:
    from forkless.bench.serve import METRICS

    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in METRICS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown metric(s) {', '.join(bad)}; choose from {', '.join(METRICS)}")
    return names


def _percentiles(value: str) -> list[float]:
    values = [float(v) for v in value.split(",") if v.strip()]
    if not values or any(not 0 <= v <= 100 for v in values):
        raise argparse.ArgumentTypeError(f"percentiles must be in [0, 100], got {value}")
    return values


def _key_value(what: str) -> Any:
    def parse(value: str) -> tuple[str, str]:
        if "=" not in value:
            raise argparse.ArgumentTypeError(f"Invalid {what} format. Please use KEY=VALUE format (got {value!r}).")
        key, val = value.split("=", 1)
        return key.strip(), val.strip()
    return parse


def _json_object(value: str) -> dict[str, Any]:
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {value}") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {value}")
    return obj


class _Refused(argparse.Action):
    """A vLLM flag this benchmark does not have: an error naming it and why, at once."""

    def __init__(self, option_strings: list[str], dest: str, why: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="*", help=argparse.SUPPRESS, **kwargs)
        self.why = why

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string} (a vllm bench serve flag) is not supported by forkless bench serve: "
                     f"{self.why}")


class _FlagListFormatter(argparse.HelpFormatter):
    """Wraps the description and epilog without breaking a ``--flag-name`` at its hyphens."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)


def _usage_error(message: str) -> SystemExit:
    """A bad combination of flags: argparse's form (``error:`` on stderr, exit status 2)."""
    import sys

    print(f"forkless bench serve: error: {message}", file=sys.stderr)
    return SystemExit(2)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    import uuid

    from forkless.bench.serve import UNSUPPORTED

    sv = sub.add_parser(
        "serve", help="online serving, vllm bench serve's flags and table", formatter_class=_FlagListFormatter,
        description="vllm bench serve's benchmark: streaming completions (or chat completions) of random "
                    "prompts at a request rate against a running server (--base-url, or --host/--port), or "
                    "against a forkless serve started here (MODEL and --server-args ...) when neither is given; "
                    "reported as vllm bench serve does.",
        epilog="vllm bench serve flags not supported here (each fails, saying why): "
               + ", ".join(UNSUPPORTED) + "; --dataset-name has only random, --backend only openai, vllm and "
               "openai-chat, --random-batch-size only 1.")
    sv.add_argument("model_pos", nargs="?", default=None, metavar="MODEL",
                    help="model to serve when no server is named (default: the embedded default model)")
    target = sv.add_argument_group("server")
    target.add_argument("--model", default=None,
                        help="model name in the requests (against a running server; default: the first of "
                             "/v1/models); without one, the model to serve")
    target.add_argument("--served-model-name", default=None,
                        help="the model field of the requests (with --model; vLLM's); a server started here "
                             "serves the model under this name")
    target.add_argument("--base-url", default=None, help="a running server, e.g. http://127.0.0.1:8000")
    target.add_argument("--host", default=None,
                        help="a running server's host (default 127.0.0.1 when --port is given): with --host or "
                             "--port and no --base-url the base URL is http://HOST:PORT, as vLLM builds it; "
                             "with none of the three a server is started here")
    target.add_argument("--port", type=port_number, default=None, help="a running server's port (default 8000 when "
                                                               "--host is given)")
    target.add_argument("--backend", type=_backend, default="openai",
                        help="openai or vllm: /v1/completions with the prompt's token ids; openai-chat: "
                             "/v1/chat/completions with the prompt, decoded by the server's /detokenize, as one "
                             "user message (default: openai)")
    target.add_argument("--endpoint", default=None,
                        help="the path posted to (default: the backend's, /v1/completions or "
                             "/v1/chat/completions); it must end as the backend's does, as in vLLM")
    target.add_argument("--header", nargs="*", type=_key_value("header"), default=None, metavar="KEY=VALUE",
                        help="extra HTTP headers of every request, e.g. Authorization='Bearer KEY' (they "
                             "override OPENAI_API_KEY's Authorization; x-request-id overrides them)")
    target.add_argument("--ready-check-timeout-sec", type=_non_negative, default=0,
                        help="> 0: first send one prompt until it succeeds, for up to this many seconds "
                             "(default 0: no check, as vLLM's)")
    target.add_argument("--startup-timeout", type=float, default=300,
                        help="seconds to wait for a server started here to answer /health")
    target.add_argument("--tokenizer", default=None,
                        help="a local model folder whose config.json gives the vocabulary the random ids are "
                             "drawn from (it names the tokenizer in the result JSON)")
    target.add_argument("--tokenizer-mode", default="auto",
                        help="accepted for vLLM's sake: no client tokenizer is loaded (prompts are token ids)")
    target.add_argument("--trust-remote-code", action="store_true",
                        help="accepted for vLLM's sake: no client tokenizer is loaded (prompts are token ids)")

    data = sv.add_argument_group("random dataset")
    data.add_argument("--dataset-name", type=_dataset, default="random", help="random (the only one here)")
    data.add_argument("--num-prompts", type=_positive(int), default=1000)
    data.add_argument("--input-len", type=_positive(int), default=None, help="sets --random-input-len (vLLM's)")
    data.add_argument("--output-len", type=_positive(int), default=None, help="sets --random-output-len (vLLM's)")
    data.add_argument("--random-input-len", type=_positive(int), default=1024)
    data.add_argument("--random-output-len", type=_positive(int), default=128)
    data.add_argument("--random-range-ratio", type=_ratio, default=0.0,
                      help="lengths uniform in [len*(1-r), len*(1+r)], 0 <= r < 1")
    data.add_argument("--random-prefix-len", type=_non_negative, default=0,
                      help="this many random tokens, the same in every request, before its random prompt "
                           "(the range ratio does not apply to them)")
    data.add_argument("--random-batch-size", type=_positive(int), default=1,
                      help="1 only: vLLM batches prompts for its embedding backends, which are not here")
    data.add_argument("--seed", type=int, default=0, help="seeds the lengths, the ids and the arrival times")

    traffic = sv.add_argument_group("traffic")
    traffic.add_argument("--request-rate", type=_rate, default=math.inf,
                         help="requests/s, Poisson arrivals (gamma with --burstiness); inf: all at once")
    traffic.add_argument("--burstiness", type=_positive(float), default=1.0,
                         help="gamma shape of the arrival gaps; 1 = Poisson, < 1 burstier, > 1 more uniform")
    traffic.add_argument("--max-concurrency", type=_positive(int), default=None, help="most requests in flight")
    traffic.add_argument("--ramp-up-strategy", choices=("linear", "exponential"), default=None,
                         help="raise the rate from --ramp-up-start-rps to --ramp-up-end-rps over the run "
                              "(not with --request-rate)")
    traffic.add_argument("--ramp-up-start-rps", type=int, default=None)
    traffic.add_argument("--ramp-up-end-rps", type=int, default=None)
    traffic.add_argument("--num-warmups", type=int, default=0, help="requests sent (and not counted) before the run")
    traffic.add_argument("--request-id-prefix", default=f"bench-{uuid.uuid4().hex[:8]}-",
                         help="request i goes out with the header x-request-id: PREFIX{i} (default bench-XXXXXXXX-)")
    traffic.add_argument("--lora-modules", nargs="+", default=None,
                         help="each request names one of these (served LoRA adapters) as its model")
    traffic.add_argument("--lora-assignment", choices=("random", "round-robin"), default="random",
                         help="how --lora-modules are given out: at random (seeded) or in turn")

    sampling = sv.add_argument_group("sampling (each sent only when given)")
    sampling.add_argument("--ignore-eos", action="store_true",
                          help="accepted for vLLM's sake: the random dataset always ignores EOS, as vLLM's does")
    for flag, kind in (("--temperature", float), ("--top-p", float), ("--top-k", int), ("--min-p", float),
                       ("--frequency-penalty", float), ("--presence-penalty", float),
                       ("--repetition-penalty", float)):
        sampling.add_argument(flag, type=kind, default=None)
    sampling.add_argument("--logprobs", type=int, default=None,
                          help="logprobs of each completion token (completions only: vLLM's openai-chat does not "
                               "send it either)")
    sampling.add_argument("--extra-body", type=_json_object, default=None,
                          help="a JSON object merged into every request body (after the flags above)")
    sampling.add_argument("--use-beam-search", action="store_true",
                          help="accepted for vLLM's sake, and ignored as vLLM's bench serve ignores it")

    report = sv.add_argument_group("report")
    report.add_argument("--percentile-metrics", type=_csv_choice, default=["ttft", "tpot", "itl"],
                        help="comma-separated, of ttft,tpot,itl,e2el,client_queue_time,e2el_including_client_queue "
                             "(default ttft,tpot,itl; the last two need --max-concurrency)")
    report.add_argument("--metric-percentiles", type=_percentiles, default=[99.0], help="comma-separated (default 99)")
    report.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                        help="SLOs (ms) of ttft, tpot, e2el: requests/s that met all of them is the "
                             "request goodput")
    report.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    report.add_argument("--save-result", action="store_true", help="write the result JSON")
    report.add_argument("--save-detailed", action="store_true",
                        help="keep the per-request lists in it (input_lens, output_lens, start_times, ttfts, itls, "
                             "generated_texts, errors)")
    report.add_argument("--append-result", action="store_true",
                        help="append the result JSON to the file (a line of its own) instead of overwriting it")
    report.add_argument("--metadata", nargs="*", type=_key_value("metadata"), default=None, metavar="KEY=VALUE",
                        help="extra keys of the result JSON")
    report.add_argument("--result-dir", default=None)
    report.add_argument("--result-filename", default=None,
                        help="default: {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json")
    report.add_argument("--label", default=None, help="the result file name's prefix (default: the backend)")
    sv.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                    help="everything after this goes to the forkless serve started here")
    for flag, why in UNSUPPORTED.items():
        sv.add_argument(flag, action=_Refused, why=why)
    sv.set_defaults(func=run_serve)


def _check_serve_args(args: argparse.Namespace) -> tuple[str, int, int] | None:
    """vLLM's checks of the flags' combinations (its messages); the ramp-up, if any."""
    from forkless.bench.serve import BACKENDS, parse_goodput

    if args.random_batch_size != 1:
        raise _usage_error(f"--random-batch-size {args.random_batch_size}: vLLM batches random prompts only for "
                           "its embedding backends, which forkless bench serve does not have (1 only)")
    if args.server_args and (args.base_url or args.host or args.port is not None):
        raise _usage_error("--server-args start a server here; they cannot go with --base-url, --host or --port, "
                           "which name a running one")
    suffix = BACKENDS[args.backend][1]
    if args.endpoint is not None and not args.endpoint.endswith((suffix, "profile")):
        raise _usage_error(f"--endpoint {args.endpoint}: the {args.backend} backend's URL must end with {suffix}")
    try:
        args.goodput_slos = parse_goodput(args.goodput or [])
    except ValueError as exc:
        raise _usage_error(f"--goodput: {exc}") from None
    if args.ramp_up_strategy is None:
        return None
    if not math.isinf(args.request_rate):
        raise _usage_error("When using ramp-up, do not specify --request-rate. The request rate will be controlled "
                           "by ramp-up parameters. Please remove the --request-rate argument.")
    start, end = args.ramp_up_start_rps, args.ramp_up_end_rps
    if start is None or end is None:
        raise _usage_error("When using --ramp-up-strategy, both --ramp-up-start-rps and --ramp-up-end-rps must be "
                           "specified")
    if start < 0 or end < 0:
        raise _usage_error("Ramp-up start and end RPS must be non-negative")
    if start > end:
        raise _usage_error("Ramp-up start RPS must be less than end RPS")
    if args.ramp_up_strategy == "exponential" and start == 0:
        raise _usage_error("For exponential ramp-up, the start RPS cannot be 0.")
    if start == 0:
        # vLLM accepts it here and then fails on the first request's rate of 0.
        raise _usage_error("--ramp-up-start-rps 0: the first request's rate would be 0 requests/s")
    return args.ramp_up_strategy, start, end


def _model_id(base_url: str, headers: dict[str, str] | None, wait: float) -> str:
    """The first model of a running server, asked again for up to ``wait`` seconds
    (the ready check's time) while it does not answer."""
    import time

    import httpx

    from forkless.bench.serve import READY_RETRY_S, served_model

    deadline = time.monotonic() + wait
    while True:
        try:
            return served_model(base_url, headers)
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            if time.monotonic() >= deadline:
                raise SystemExit(f"forkless bench serve: no model list at {base_url}/v1/models: {exc}") from None
        time.sleep(min(READY_RETRY_S, max(0.0, deadline - time.monotonic())))


def run_serve(args: argparse.Namespace) -> int:
    from datetime import datetime

    from forkless.bench import serve as bs

    ramp_up = _check_serve_args(args)
    headers = dict(args.header or [])
    if args.input_len is not None:
        args.random_input_len = args.input_len
    if args.output_len is not None:
        args.random_output_len = args.output_len
    model_arg = args.model or args.model_pos
    proc = None
    startup = None
    if args.base_url is not None:
        base_url = args.base_url.rstrip("/").removesuffix("/v1")
    elif args.host is not None or args.port is not None:
        # vLLM's base URL when there is no --base-url; a bracketed host for IPv6.
        host = args.host or "127.0.0.1"
        base_url = f"http://{f'[{host}]' if ':' in host else host}:{8000 if args.port is None else args.port}"
    else:
        log = tempfile.NamedTemporaryFile("wb", prefix="forkless-serve-", suffix=".log", delete=False)
        port = bs.free_port()
        named = ["--served-model-name", args.served_model_name] if args.served_model_name else []
        serve_args = [*([model_arg] if model_arg else []), "--uvicorn-log-level", "warning", *named,
                      *args.server_args]
        proc, startup = bs.start_server(serve_args, port, log, timeout=args.startup_timeout)
        base_url = f"http://127.0.0.1:{port}"
        print(f"start -> /health OK: {startup:.2f} s; server log {log.name}", flush=True)
    try:
        if proc is None and args.model:
            model_id = args.model
        else:
            model_id = _model_id(base_url, headers, args.ready_check_timeout_sec)
        # vLLM's --served-model-name renames the requests' model only when --model names it.
        model_name = args.served_model_name if proc is None and args.model and args.served_model_name else model_id
        vocab_from = args.tokenizer or (model_arg if proc is not None else args.model)
        requests = bs.random_requests(args.num_prompts, args.random_input_len, args.random_output_len,
                                      args.random_range_ratio, bs.vocab_size_of(vocab_from), args.seed,
                                      args.random_prefix_len, args.request_id_prefix)
        sampling = {k: v for k, v in (("top_p", args.top_p), ("top_k", args.top_k), ("min_p", args.min_p),
                                      ("temperature", args.temperature),
                                      ("frequency_penalty", args.frequency_penalty),
                                      ("presence_penalty", args.presence_penalty),
                                      ("repetition_penalty", args.repetition_penalty)) if v is not None}
        names = (bs.lora_names(args.lora_modules, len(requests), args.lora_assignment, args.seed)
                 if args.lora_modules else None)
        if ramp_up is not None:
            print(f"Traffic ramp-up strategy: {ramp_up[0]}.\nWill increase RPS from {ramp_up[1]} to {ramp_up[2]} "
                  "RPS over the duration of the benchmark.", flush=True)
        else:
            print(f"Traffic request rate: {args.request_rate}", flush=True)
        print(f"Burstiness factor: {args.burstiness} "
              f"({'Poisson process' if args.burstiness == 1.0 else 'Gamma distribution'})\n"
              f"Maximum request concurrency: {args.max_concurrency}", flush=True)
        run = asyncio.run(bs.run_requests(
            base_url, model_name, requests, args.request_rate, args.burstiness, args.max_concurrency,
            ignore_eos=True, seed=args.seed, extra_body=sampling | (args.extra_body or {}),
            num_warmups=args.num_warmups, backend=args.backend, endpoint=args.endpoint, headers=headers,
            logprobs=args.logprobs, ramp_up=ramp_up, model_names=names, progress=not args.disable_tqdm,
            ready_check_timeout=args.ready_check_timeout_sec))
    finally:
        if proc is not None:
            bs.stop_server(proc)
    metrics = bs.calculate_metrics(run, args.percentile_metrics, args.metric_percentiles, args.goodput_slos,
                                   args.max_concurrency, args.request_rate)
    failed = [e for o, e in zip(run.outputs, metrics["errors"]) if not o.success]
    if failed:
        print("Failed requests during benchmark run detected (capping to 10):")
        for i, err in enumerate(failed[:10]):
            print(f"Error {i}: {err}")
    print(bs.format_result(metrics, args.percentile_metrics, args.metric_percentiles, args.max_concurrency,
                           args.request_rate))
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    result = {"date": date, "endpoint_type": args.backend, "backend": args.backend, "label": args.label,
              "model_id": model_id, "tokenizer_id": args.tokenizer or model_id, "num_prompts": args.num_prompts}
    result |= dict(args.metadata or [])
    result |= {"request_rate": args.request_rate if not math.isinf(args.request_rate) else "inf",
               "burstiness": args.burstiness, "max_concurrency": args.max_concurrency}
    if ramp_up is not None:
        result |= {"ramp_up_strategy": ramp_up[0], "ramp_up_start_rps": ramp_up[1], "ramp_up_end_rps": ramp_up[2]}
    result |= metrics
    if not args.save_detailed:
        for key in bs.DETAILED_KEYS:
            result.pop(key, None)
    if startup is not None:
        result["server_startup_s"] = startup
    if args.save_result or args.append_result:
        name = args.result_filename or bs.result_filename(model_id, args.request_rate, args.max_concurrency, date,
                                                          args.label, args.backend, ramp_up)
        path = Path(args.result_dir or ".") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+" if args.append_result else "w", encoding="utf-8") as out:
            if args.append_result and out.tell() != 0:
                out.write("\n")  # one result a line (vLLM's)
            json.dump(result, out)
        print(f"result written to {path}")
    return 0 if metrics["failed"] == 0 else 1
