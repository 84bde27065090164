"""``forkless bench throughput|latency|serve``: the benchmarks from the command line.

``throughput`` runs the workload of ``forkless.bench.throughput`` (the same as
``benchmarks/throughput.py``) through forkless and through transformers ``generate`` in
the same run and prints both rates and their ratio, and the workload's hardware floor
(``forkless.bench.floor``) next to the measured time; ``latency`` times batch-1 decode
against the memory-bandwidth bound. ``--shape`` writes a model folder of a known shape
(with ``--load-format dummy`` no weights are needed). ``serve`` is ``vllm bench serve``
with its flag names and result table (``forkless.bench.serve``), against ``--base-url``
or a ``forkless serve`` it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from forkless.config import EngineArgs


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench`` and its sub-commands."""
    parser = subparsers.add_parser("bench", help="benchmark forkless",
                                   description="Offline benchmarks (see benchmarks/README.md).")
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)

    tp = sub.add_parser("throughput", help="output tokens/s against transformers generate")
    _common(tp)
    tp.add_argument("-n", "--num-prompts", type=int, default=512)
    tp.add_argument("--input-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"))
    tp.add_argument("--output-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"))
    tp.add_argument("--workload-seed", type=int, default=0, help="seeds the random lengths and ids")
    tp.add_argument("--hf-batch-size", type=int, default=64, help="static batch size of the baseline")
    tp.add_argument("--hf-max-batches", type=int, default=None,
                    help="run only the first N baseline batches (its rate, not its total, is compared)")
    tp.add_argument("--skip-hf", action="store_true", help="forkless only")
    tp.add_argument("--peak-tflops", type=float, default=None,
                    help="peak FLOP/s (in TFLOP/s) for the floor's prefill compute (default: the "
                         "device's data-sheet dense bf16 number; on the CPU a matmul measured in the run)")
    tp.set_defaults(func=run_throughput)

    lat = sub.add_parser("latency", help="batch-1 time per output token against the bandwidth bound")
    _common(lat)
    lat.add_argument("--prompt-len", type=int, default=128)
    lat.add_argument("--output-len", type=int, default=256)
    lat.set_defaults(func=run_latency)

    _add_serve(sub)
    return parser


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
    from forkless.bench.throughput import make_workload, run_forkless, run_transformers
    from forkless.platforms import current_platform

    with tempfile.TemporaryDirectory() as tmp:
        model = _model(args, tmp)
        config = json.loads((Path(model) / "config.json").read_text())
        work = make_workload(args.num_prompts, tuple(args.input_len), tuple(args.output_len),
                             config["vocab_size"], args.workload_seed)
        kwargs = _engine_kwargs(args)
        if args.max_model_len is None:
            kwargs.pop("max_model_len")
        device_type = current_platform.device_type
        device = str(current_platform.torch_device())
        dtype = _dtype(args, config, device_type)
        print(f"model={args.shape or model} n={len(work)} input={list(args.input_len)} "
              f"output={list(args.output_len)} dtype={args.dtype} load_format={args.load_format}", flush=True)
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


def _dataset(value: str) -> str:
    from forkless.bench.serve import DATASETS

    if value not in DATASETS:
        raise argparse.ArgumentTypeError(
            f"unknown dataset {value!r}; forkless bench serve has: {', '.join(DATASETS)}")
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


def _add_serve(sub: argparse._SubParsersAction) -> None:
    sv = sub.add_parser(
        "serve", help="online serving, vllm bench serve's flags and table",
        description="Streaming /v1/completions at a request rate against --base-url, or against a forkless "
                    "serve started here (MODEL and --server-args ...), reported as vllm bench serve does.")
    sv.add_argument("model_pos", nargs="?", default=None, metavar="MODEL",
                    help="model to serve when no --base-url is given (default: the embedded default model)")
    sv.add_argument("--model", default=None,
                    help="model name in the requests (with --base-url; default: the first of /v1/models); "
                         "without --base-url, the model to serve")
    sv.add_argument("--base-url", default=None, help="a running server, e.g. http://127.0.0.1:8000")
    sv.add_argument("--tokenizer", default=None,
                    help="a local model folder whose config.json gives the vocabulary the random ids are drawn from")
    sv.add_argument("--dataset-name", type=_dataset, default="random", help="random (the only one here)")
    sv.add_argument("--random-input-len", type=_positive(int), default=1024)
    sv.add_argument("--random-output-len", type=_positive(int), default=128)
    sv.add_argument("--random-range-ratio", type=_ratio, default=0.0,
                    help="lengths uniform in [len*(1-r), len*(1+r)], 0 <= r < 1")
    sv.add_argument("--num-prompts", type=_positive(int), default=1000)
    sv.add_argument("--request-rate", type=_rate, default=math.inf,
                    help="requests/s, Poisson arrivals (gamma with --burstiness); inf: all at once")
    sv.add_argument("--burstiness", type=_positive(float), default=1.0,
                    help="gamma shape of the arrival gaps; 1 = Poisson, < 1 burstier, > 1 more uniform")
    sv.add_argument("--max-concurrency", type=_positive(int), default=None, help="most requests in flight")
    sv.add_argument("--percentile-metrics", type=_csv_choice, default=["ttft", "tpot", "itl"],
                    help="comma-separated, of ttft,tpot,itl,e2el (default ttft,tpot,itl)")
    sv.add_argument("--metric-percentiles", type=_percentiles, default=[99.0], help="comma-separated (default 99)")
    sv.add_argument("--ignore-eos", action="store_true",
                    help="accepted for vLLM's sake: the random dataset always ignores EOS, as vLLM's does")
    sv.add_argument("--temperature", type=float, default=None, help="sent when given (default: the server's)")
    sv.add_argument("--num-warmups", type=int, default=0, help="requests sent (and not counted) before the run")
    sv.add_argument("--seed", type=int, default=0, help="seeds the lengths, the ids and the arrival times")
    sv.add_argument("--save-result", action="store_true", help="write the result JSON")
    sv.add_argument("--result-dir", default=None)
    sv.add_argument("--result-filename", default=None,
                    help="default: openai-{rate}qps[-concurrency{N}]-{model}-{date}.json")
    sv.add_argument("--label", default=None, help="the result file name's prefix (default: openai)")
    sv.add_argument("--startup-timeout", type=float, default=300, help="seconds to wait for the server's /health")
    sv.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                    help="everything after this goes to forkless serve")
    sv.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from datetime import datetime

    import httpx

    from forkless.bench import serve as bs

    model_arg = args.model or args.model_pos
    proc = None
    startup = None
    if args.base_url is None:
        log = tempfile.NamedTemporaryFile("wb", prefix="forkless-serve-", suffix=".log", delete=False)
        port = bs.free_port()
        serve_args = [*([model_arg] if model_arg else []), "--uvicorn-log-level", "warning", *args.server_args]
        proc, startup = bs.start_server(serve_args, port, log, timeout=args.startup_timeout)
        base_url = f"http://127.0.0.1:{port}"
        print(f"start -> /health OK: {startup:.2f} s; server log {log.name}", flush=True)
    else:
        base_url = args.base_url.rstrip("/").removesuffix("/v1")
    try:
        try:
            model_id = (args.model if proc is None else None) or bs.served_model(base_url)
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            raise SystemExit(f"forkless bench serve: no model list at {base_url}/v1/models: {exc}") from None
        vocab_from = args.tokenizer or (model_arg if args.base_url is None else args.model)
        requests = bs.random_requests(args.num_prompts, args.random_input_len, args.random_output_len,
                                      args.random_range_ratio, bs.vocab_size_of(vocab_from), args.seed)
        extra = {} if args.temperature is None else {"temperature": args.temperature}
        print(f"Traffic request rate: {args.request_rate}\nBurstiness factor: {args.burstiness} "
              f"({'Poisson process' if args.burstiness == 1.0 else 'Gamma distribution'})\n"
              f"Maximum request concurrency: {args.max_concurrency}", flush=True)
        run = asyncio.run(bs.run_requests(base_url, model_id, requests, args.request_rate, args.burstiness,
                                          args.max_concurrency, ignore_eos=True, seed=args.seed, extra_body=extra,
                                          num_warmups=args.num_warmups))
    finally:
        if proc is not None:
            bs.stop_server(proc)
    metrics = bs.calculate_metrics(run, args.percentile_metrics, args.metric_percentiles)
    for err in metrics["errors"][:10]:
        print(f"failed request: {err}")
    print(bs.format_result(metrics, args.percentile_metrics, args.metric_percentiles, args.max_concurrency,
                           args.request_rate))
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    result = {"date": date, "endpoint_type": "openai", "backend": "openai", "label": args.label,
              "model_id": model_id, "tokenizer_id": args.tokenizer or model_id, "num_prompts": args.num_prompts,
              "request_rate": args.request_rate if not math.isinf(args.request_rate) else "inf",
              "burstiness": args.burstiness, "max_concurrency": args.max_concurrency}
    result |= {k: v for k, v in metrics.items() if k != "errors"}
    if startup is not None:
        result["server_startup_s"] = startup
    if args.save_result:
        name = args.result_filename or bs.result_filename(model_id, args.request_rate, args.max_concurrency, date,
                                                          args.label)
        path = Path(args.result_dir or ".") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))
        print(f"result written to {path}")
    return 0 if metrics["failed"] == 0 else 1
