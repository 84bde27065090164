"""``forkless bench throughput|latency``: the offline benchmarks from the command line.

``throughput`` runs the workload of ``forkless.bench.throughput`` (the same as
``benchmarks/throughput.py``) through forkless and through transformers ``generate`` in
the same run and prints both rates and their ratio; ``latency`` times batch-1 decode
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


def run_throughput(args: argparse.Namespace) -> int:
    from forkless.bench.throughput import make_workload, run_forkless, run_transformers

    with tempfile.TemporaryDirectory() as tmp:
        model = _model(args, tmp)
        config = json.loads((Path(model) / "config.json").read_text())
        work = make_workload(args.num_prompts, tuple(args.input_len), tuple(args.output_len),
                             config["vocab_size"], args.workload_seed)
        kwargs = _engine_kwargs(args)
        if args.max_model_len is None:
            kwargs.pop("max_model_len")
        print(f"model={args.shape or model} n={len(work)} input={list(args.input_len)} "
              f"output={list(args.output_len)} dtype={args.dtype} load_format={args.load_format}", flush=True)
        fk = run_forkless(model, work, **kwargs)
        print(f"forkless:     {fk.tokens} tokens in {fk.seconds:7.2f} s = {fk.tokens_per_s:9.1f} output tok/s",
              flush=True)
        result: dict[str, Any] = {"forkless": vars(fk) | {"tokens_per_s": fk.tokens_per_s}}
        if not args.skip_hf:
            from forkless.platforms import current_platform

            dtype = args.dtype if args.dtype != "auto" else (
                "float32" if current_platform.device_type == "cpu" else config.get("dtype", "float32"))
            hf = run_transformers(model, work, args.hf_batch_size, dtype=dtype,
                                  device=str(current_platform.torch_device()),
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

    with tempfile.TemporaryDirectory() as tmp:
        model = _model(args, tmp)
        kwargs = _engine_kwargs(args)
        kwargs.pop("max_num_seqs")  # batch 1 by definition
        if kwargs.get("max_model_len") is None:
            kwargs["max_model_len"] = args.prompt_len + args.output_len + 16
        bandwidth = copy_bandwidth()
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
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model)
    torch_dtype = getattr(torch, dtype if dtype != "auto" else str(config.dtype).removeprefix("torch."))
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    return sum(p.numel() * p.element_size() for p in m.parameters())
