"""``forkless bench throughput|latency``: the offline benchmarks from the command line.

``throughput`` runs the workload of ``forkless.bench.throughput`` (the same as
``benchmarks/throughput.py``) through forkless and through transformers ``generate`` in
the same run and prints both rates and their ratio, and the workload's hardware floor
(``forkless.bench.floor``) next to the measured time; ``latency`` times batch-1 decode
against the memory-bandwidth bound. ``--shape`` writes a model folder of a known shape
(with ``--load-format dummy`` no weights are needed).
"""

from __future__ import annotations

import argparse
import json
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
    from forkless.bench.floor import describe, load_shape, peak_flops, throughput_floor
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
        flops, flops_source = peak_flops(device_type, args.peak_tflops)
        floor = throughput_floor(load_shape(model, DTYPE_BYTES[dtype]), [(len(p), o) for p, o in work],
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

