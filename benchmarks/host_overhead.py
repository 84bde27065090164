"""The engine's host work per request per step, and the pauses of garbage collection.

A model too small to cost anything (1 layer, hidden size 32, vocabulary 512, random
weights) decodes a batch of 256 requests (32-token prompts, 128 output tokens, greedy,
``ignore_eos``, ``detokenize=False``) offline, so that the time is the engine's own:
scheduling, input preparation, sampling bookkeeping, outputs. Each run is a fresh process;
``tuned`` calls ``forkless.gc_tuning.tune_process()`` once the engine is built, as
forkless's own processes do (API server, engine core, workers); ``offline LLM`` does not,
and gets what an ``LLM`` in a user's process gets: Python's collector, with full
collections paused while ``generate`` runs (``forkless.gc_tuning.paused_full_collections``).
Both are measured in the same run, interleaved, best of ``--repeats``. Prints ms per
step, µs per request per step, the time spent in collections during the run
(``gc.callbacks``) with their count per generation, and the pause of one full collection
of the built engine (what a step waits whenever Python decides to collect the oldest
generation, which depends on allocation history, so a given run may or may not contain
one).

    python benchmarks/host_overhead.py [--batch 256] [--repeats 3]
    # the server's way of stepping: async scheduling, the worker in a process of its own
    # (one torch thread), where each step's plan and results cross a socket
    python benchmarks/host_overhead.py --async-scheduling --distributed-executor-backend mp
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

MICRO = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
         "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
         "head_dim": 16, "vocab_size": 512, "max_position_embeddings": 2048, "rope_theta": 10000.0,
         "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
         "bos_token_id": 1, "eos_token_id": 2}


def child(model: str, batch: int, tuned: bool, engine: dict) -> dict:
    import gc

    import torch

    from forkless import LLM, SamplingParams

    torch.set_num_threads(1)
    llm = LLM(model, load_format="dummy", max_num_seqs=batch, max_model_len=512, max_num_batched_tokens=8192, **engine)
    if tuned:
        from forkless.gc_tuning import tune_process

        tune_process()
    prompts = [{"prompt_token_ids": [3 + (i * 7 + j) % 500 for j in range(32)]} for i in range(batch)]
    llm.generate(prompts[:8], SamplingParams(max_tokens=4), use_tqdm=False)
    pause = time.perf_counter()
    gc.collect()
    pause = time.perf_counter() - pause
    spent = {"seconds": 0.0, "count": [0, 0, 0], "started": 0.0}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            spent["started"] = time.perf_counter()
        else:
            spent["seconds"] += time.perf_counter() - spent["started"]
            spent["count"][info["generation"]] += 1

    gc.callbacks.append(on_gc)
    steps = 128
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True, detokenize=False)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    gc.callbacks.remove(on_gc)
    llm.shutdown()
    return {"elapsed": elapsed, "step_ms": elapsed / steps * 1e3, "us_per_request_step": elapsed / steps / batch * 1e6,
            "gc_s": spent["seconds"], "gc_count": spent["count"], "pause_s": pause}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--distributed-executor-backend", choices=["uni", "mp"], default="uni")
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "BATCH", "TUNED", "ENGINE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, batch, tuned, engine = args.child
        print(json.dumps(child(model, int(batch), tuned == "1", json.loads(engine))))
        return
    from forkless.bench import shapes

    shapes.SHAPES.setdefault("micro", MICRO)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    with tempfile.TemporaryDirectory() as tmp:
        model = str(shapes.write_model_folder(Path(tmp) / "micro", "micro", dtype="float32"))
        best: dict[str, dict] = {}
        engine = json.dumps({"async_scheduling": args.async_scheduling,
                             "distributed_executor_backend": args.distributed_executor_backend})
        # (The mp worker takes one torch thread too, unless told otherwise.)
        env = dict(os.environ, FORKLESS_WORKER_THREADS=os.environ.get("FORKLESS_WORKER_THREADS", "1"))
        for _ in range(args.repeats):
            for name, tuned in (("tuned", "1"), ("offline LLM", "0")):
                out = subprocess.run([sys.executable, __file__, "--child", model, str(args.batch), tuned, engine],
                                     capture_output=True, text=True, check=True, env=env).stdout
                run = json.loads(out.strip().splitlines()[-1])
                if name not in best or run["elapsed"] < best[name]["elapsed"]:
                    best[name] = run
    print(f"CPU {cpu}; batch {args.batch}, 128 steps, best of {args.repeats}; executor "
          f"{args.distributed_executor_backend}, {'async' if args.async_scheduling else 'synchronous'} steps")
    print("| engine | ms / step | µs / request / step | in collections | collections (gen 0/1/2) "
          "| one full collection |")
    print("|---|---:|---:|---:|---|---:|")
    for name, run in best.items():
        print(f"| {name} | {run['step_ms']:.2f} | {run['us_per_request_step']:.1f} | "
              f"{run['gc_s'] * 1e3:.0f} ms ({100 * run['gc_s'] / run['elapsed']:.1f} %) | {run['gc_count']} | "
              f"{run['pause_s'] * 1e3:.1f} ms |")
    ratio = best["offline LLM"]["elapsed"] / best["tuned"]["elapsed"]
    print(f"tuned speed / offline LLM: {ratio:.2f}x (run time; noisy on a loaded machine)")


if __name__ == "__main__":
    main()
