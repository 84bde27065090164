"""Pipeline parallelism on the CPU: micro-batches in flight against one batch at a time.

With ``-pp 2`` the engine core keeps one batch in flight per stage: stage 0 runs batch N
while stage 1 runs batch N - 1, and each batch holds about half of the requests. The
baseline is the same ``-pp 2`` engine with a scheduler that declares no concurrent
batches (``--scheduler-cls`` with ``supports_concurrent_batches = False``): every batch
then goes through stage 0 and stage 1 in turn while the other stage waits. Also shown:
``-pp 1`` on the ``mp`` executor with one and with two threads (the cores ``-pp 2`` uses).

Offline ``LLM``, Qwen3-0.6B's width with ``--layers`` layers, random weights
(``load_format="dummy"``), ``--batch`` requests of 16-token prompts and ``--tokens`` greedy
tokens (``ignore_eos``); each configuration in a fresh process, alternated, best of
``--repeats``; output tokens per second of the whole ``generate`` and the ratio against the
baseline.

    python benchmarks/pp.py [--layers 8] [--batch 16] [--tokens 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from forkless.core.sched.scheduler import Scheduler  # noqa: E402


class OneBatchScheduler(Scheduler):
    """The built-in scheduler without concurrent batches: ``-pp`` runs one batch at a time."""

    supports_concurrent_batches = False


CONFIGS = {
    "pp2 micro-batches": dict(pipeline_parallel_size=2),
    "pp2 one batch at a time": dict(pipeline_parallel_size=2, scheduler_cls="__main__:OneBatchScheduler"),
    "pp1 1 thread": dict(pipeline_parallel_size=1, num_threads=1),
    "pp1 2 threads": dict(pipeline_parallel_size=1, num_threads=2),
}
BASELINE = "pp2 one batch at a time"


def child(folder: str, name: str, batch: int, tokens: int) -> dict:
    from forkless import LLM, SamplingParams

    llm = LLM(model=folder, load_format="dummy", distributed_executor_backend="mp", max_model_len=256,
              kv_cache_memory=256 << 20, max_num_seqs=batch, **CONFIGS[name])
    try:
        prompts = [{"prompt_token_ids": [100 + 7 * i + j for j in range(16)]} for i in range(batch)]
        llm.generate(prompts[:2], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
        start = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True),
                            use_tqdm=False)
        elapsed = time.perf_counter() - start
        produced = sum(len(o.outputs[0].token_ids) for o in outs)
        return {"seconds": elapsed, "tokens": produced, "first": list(outs[0].outputs[0].token_ids[:8])}
    finally:
        llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.batch, args.tokens)))
        return
    from forkless.bench import shapes

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(shapes.write_model_folder(Path(tmp) / "m", "qwen3-0.6b", dtype="float32", num_layers=args.layers))
        for _ in range(args.repeats):
            for name in args.configs:
                out = subprocess.run([sys.executable, __file__, "--child", folder, name, "--batch", str(args.batch),
                                      "--tokens", str(args.tokens)], capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
                run = json.loads(out.stdout.strip().splitlines()[-1])
                if name not in best or run["seconds"] < best[name]["seconds"]:
                    best[name] = run
    firsts = {json.dumps(r["first"]) for r in best.values()}
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"CPU {cpu}; Qwen3-0.6B width, {args.layers} layers, random weights, float32; {args.batch} requests x "
          f"{args.tokens} tokens; best of {args.repeats}; load {' '.join(load)}")
    print("| engine | seconds | output tok/s | vs one batch at a time |")
    print("|---|---:|---:|---:|")
    base = best.get(BASELINE)
    for name, run in best.items():
        ratio = f"{base['seconds'] / run['seconds']:.2f}x" if base else "-"
        print(f"| {name} | {run['seconds']:.2f} | {run['tokens'] / run['seconds']:.1f} | {ratio} |")
    print("same first tokens in every configuration:", len(firsts) == 1)


if __name__ == "__main__":
    main()
