"""Offline throughput: forkless ``LLM.generate`` against ``transformers`` ``generate``.

N prompts of random token ids with random input and output lengths (seeded), every
request run to exactly its own output length (``ignore_eos``). The baseline is
Hugging Face ``generate`` on the same model folder, in padded static batches of a fixed
size (left padding, in request order), each batch running to its longest request. Only
useful tokens count for both: each request's own output length. Both run in this process,
one after the other, with the same thread count.

    python benchmarks/throughput.py                      # SmolLM2-135M (the default model)
    python benchmarks/throughput.py --model random-4l    # random 4-layer model, SmolLM2 shape
    python benchmarks/throughput.py -n 16 --output-len 16 64 --hf-batch-size 8
    python benchmarks/throughput.py --isa avx2,avx512 --repeat 2 --skip-hf   # CPU ISA levels

Every run prints the CPU model and the ISA level of forkless's CPU kernels. ``--isa`` runs
forkless with its kernels held to each listed level (``FORKLESS_CPU_ISA``), each run in a
fresh process, the levels alternated ``--repeat`` times (so load from other processes hits
them alike), and prints each run, the best per level and its ratio to the first level.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from forkless.bench.throughput import make_workload  # the same draws as `forkless bench throughput`


def random_model(out: Path, layers: int) -> Path:
    """A random-weight Llama with SmolLM2-135M's shapes and tokenizer, ``layers`` deep."""
    import shutil

    from transformers import AutoModelForCausalLM, LlamaConfig

    from forkless.model_loader.default_model import default_model_path

    src = Path(default_model_path())
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    cfg.pop("architectures", None)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    model.save_pretrained(out, safe_serialization=True)
    return out


def run_forkless(model: str, work: list[tuple[list[int], int]], args: argparse.Namespace) -> tuple[float, int]:
    """Seconds and output tokens for all requests through one ``LLM.generate`` call."""
    from forkless import LLM, SamplingParams

    max_len = max(len(p) + o for p, o in work) + 16
    llm = LLM(model, max_model_len=max_len, max_num_seqs=args.max_num_seqs, num_threads=args.threads,
              kv_cache_memory=args.kv_cache_gib << 30, enable_prefix_caching=False, dtype=args.dtype,
              attention_backend=args.attention_backend)
    params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True) for _, o in work]
    prompts = [{"prompt_token_ids": p} for p, _ in work]
    llm.generate(prompts[:2], [SamplingParams(max_tokens=4, ignore_eos=True)] * 2, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert tokens == sum(o for _, o in work), "forkless did not produce every requested token"
    llm.shutdown()
    return elapsed, tokens


def run_transformers(model: str, work: list[tuple[list[int], int]], args: argparse.Namespace) -> tuple[float, int]:
    """Seconds and useful output tokens for padded static batches through HF ``generate``."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    pad = hf.config.eos_token_id if isinstance(hf.config.eos_token_id, int) else 0

    def batch(items: list[tuple[list[int], int]]) -> None:
        width = max(len(p) for p, _ in items)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in items])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in items])
        new = max(o for _, o in items)
        # min_new_tokens = max_new_tokens: EOS is suppressed, as with ignore_eos.
        hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                    do_sample=False, pad_token_id=pad)

    with torch.inference_mode():
        batch(work[:2] and [(work[0][0], 4), (work[1][0], 4)])  # warm-up
        t0 = time.perf_counter()
        for i in range(0, len(work), args.hf_batch_size):
            batch(work[i : i + args.hf_batch_size])
        elapsed = time.perf_counter() - t0
    return elapsed, sum(o for _, o in work)


def cpu_line() -> str:
    """The CPU model, the ISA level of forkless's kernels in this process and the load."""
    from forkless import cpu_kernels

    return (f"CPU: {cpu_kernels.cpu_model()}; ISA: {cpu_kernels.isa() or 'none (torch ops)'} "
            f"(supported: {', '.join(cpu_kernels.supported_isas())}); torch {torch.__version__} "
            f"({torch.backends.cpu.get_cpu_capability()}); load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def compare_isas(levels: list[str], args: argparse.Namespace) -> None:
    """forkless under each ISA level in a fresh process, alternated ``--repeat`` times."""
    child_args = [a for a in sys.argv[1:]]
    for flag in ("--isa", "--repeat"):  # the child runs one level once
        while flag in child_args:
            i = child_args.index(flag)
            del child_args[i : i + 2]
    runs: dict[str, list[float]] = {level: [] for level in levels}
    for r in range(args.repeat):
        order = levels if r % 2 == 0 else levels[::-1]
        for level in order:
            env = {**os.environ, "FORKLESS_CPU_ISA": level}
            load = os.getloadavg()[0]
            proc = subprocess.run([sys.executable, __file__, *child_args, "--skip-hf", "--result-json"], env=env,
                                  capture_output=True, text=True)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                sys.exit(f"forkless under {level} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            res = json.loads(lines[-1][len("RESULT "):])
            assert res["isa"] == level, f"asked for {level}, the kernels ran {res['isa']}"
            runs[level].append(res["tokens"] / res["seconds"])
            print(f"  run {r + 1} {level:8s}: {res['tokens']} tokens in {res['seconds']:7.2f} s = "
                  f"{runs[level][-1]:7.1f} tok/s (load before {load:.2f}, after {os.getloadavg()[0]:.2f})",
                  flush=True)
    base = levels[0]
    for level in levels:
        best = max(runs[level])
        print(f"forkless {level:8s}: best {best:7.1f} tok/s, runs {', '.join(f'{x:.1f}' for x in runs[level])}; "
              f"best / best {base}: {best / max(runs[base]):.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None,
                    help="model folder; default: the embedded SmolLM2-135M; 'random-4l': a random 4-layer model")
    ap.add_argument("-n", "--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"))
    ap.add_argument("--output-len", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"))
    ap.add_argument("--hf-batch-size", type=int, default=16, help="static batch size of the baseline")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--kv-cache-gib", type=int, default=2)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-hf", action="store_true", help="forkless only (for profiling)")
    ap.add_argument("--dtype", default="auto", help="forkless's --dtype (the baseline runs float32)")
    ap.add_argument("--attention-backend", default=None, help="forkless's --attention-backend (default: the platform's)")
    ap.add_argument("--isa", default=None,
                    help="comma-separated CPU ISA levels (avx512, avx2, portable) to run forkless under, "
                         "each in a fresh process, alternated; the first is the baseline of the ratios")
    ap.add_argument("--repeat", type=int, default=1, help="runs per level with --isa")
    ap.add_argument("--result-json", action="store_true", help=argparse.SUPPRESS)  # a child of --isa
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from forkless import cpu_kernels
    from forkless.model_loader.default_model import default_model_path

    levels = [level.strip().lower() for level in args.isa.split(",")] if args.isa else []
    for level in levels:
        if level not in cpu_kernels.ISA_LEVELS:
            ap.error(f"--isa {level!r}: expected levels among {', '.join(cpu_kernels.ISA_LEVELS)}")
        if level not in cpu_kernels.supported_isas():
            ap.error(f"--isa {level!r}: this CPU ({cpu_kernels.cpu_model()}) has "
                     f"{', '.join(cpu_kernels.supported_isas())}")
    if len(levels) == 1:
        os.environ["FORKLESS_CPU_ISA"] = levels[0]

    tmp = None
    if args.model is None:
        model = str(default_model_path())
    elif args.model.startswith("random-") and args.model.endswith("l"):
        tmp = tempfile.TemporaryDirectory()
        model = str(random_model(Path(tmp.name), int(args.model[len("random-"):-1])))
    else:
        model = args.model
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    work = make_workload(args.num_prompts, tuple(args.input_len), tuple(args.output_len), vocab, args.seed)
    if not args.result_json:
        print(f"model={args.model or 'default (SmolLM2-135M)'} n={len(work)} input={args.input_len} "
              f"output={args.output_len} threads={args.threads} hf_batch={args.hf_batch_size}", flush=True)

    if len(levels) > 1:
        if tmp is not None:  # the children make their own
            tmp.cleanup()
        print(cpu_line(), flush=True)
        compare_isas(levels, args)
    else:
        f_s, f_tok = run_forkless(model, work, args)
        if args.result_json:
            print("RESULT " + json.dumps({"isa": cpu_kernels.isa(), "seconds": f_s, "tokens": f_tok}), flush=True)
        else:
            print(cpu_line(), flush=True)
            print(f"forkless:     {f_tok} tokens in {f_s:7.2f} s = {f_tok / f_s:8.1f} output tok/s", flush=True)
    if not args.skip_hf and not args.result_json:
        h_s, h_tok = run_transformers(model, work, args)
        print(f"transformers: {h_tok} tokens in {h_s:7.2f} s = {h_tok / h_s:8.1f} output tok/s")
        if len(levels) <= 1:
            print(f"ratio forkless / transformers: {(f_tok / f_s) / (h_tok / h_s):.2f}x")
    if tmp is not None and len(levels) <= 1:
        tmp.cleanup()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
