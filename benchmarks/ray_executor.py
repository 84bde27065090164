"""What a step costs through Ray: ``--distributed-executor-backend ray`` against ``mp``.

A model too small to cost anything (1 layer, hidden size 32, vocabulary 512, random
weights) decodes offline (32-token prompts, 128 output tokens, greedy, ``ignore_eos``,
``detokenize=False``), so that a step's time is the engine's and the executor's own: for
``mp`` a ZeroMQ round trip to the worker process, for ``ray`` a Ray task to the actor and
its result. Each run is a fresh process (``ray``: the executor starts a Ray instance of its
own before the clock starts, or joins ``RAY_ADDRESS``), interleaved with the others, best
of ``--repeats``; ``mp`` with the same ``--async-scheduling`` setting is the baseline.

    python benchmarks/ray_executor.py [--batches 1,32] [--repeats 3]
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
STEPS = 128


def child(model: str, backend: str, batch: int, async_scheduling: bool) -> dict:
    from forkless import LLM, SamplingParams

    llm = LLM(model, load_format="dummy", max_num_seqs=batch, max_model_len=512, kv_cache_memory=64 << 20,
              distributed_executor_backend=backend, async_scheduling=async_scheduling)
    prompts = [{"prompt_token_ids": [3 + (i * 7 + j) % 500 for j in range(32)]} for i in range(batch)]
    llm.generate(prompts, SamplingParams(max_tokens=4), use_tqdm=False)  # warm up
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, detokenize=False)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    llm.shutdown()
    return {"elapsed": elapsed, "step_ms": elapsed / STEPS * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "BACKEND", "BATCH", "ASYNC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, backend, batch, async_flag = args.child
        print(json.dumps(child(model, backend, int(batch), async_flag == "1")))
        return
    from forkless.bench import shapes

    shapes.SHAPES.setdefault("micro", MICRO)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    # A Ray instance the executor starts itself would turn token authentication on and
    # write a token to ~/.ray: leave it off unless the caller chose.
    env = {"RAY_AUTH_MODE": "disabled", **os.environ}
    runs = [(backend, batch, flag) for batch in map(int, args.batches.split(","))
            for flag in ("0", "1") for backend in ("mp", "ray")]
    best: dict[tuple[str, int, str], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = str(shapes.write_model_folder(Path(tmp) / "micro", "micro", dtype="float32"))
        env.setdefault("RAY_TMPDIR", tmp)  # the Ray instances' files go with the model's
        for _ in range(args.repeats):
            for key in runs:
                backend, batch, flag = key
                out = subprocess.run([sys.executable, __file__, "--child", model, backend, str(batch), flag],
                                     capture_output=True, text=True, check=True, env=env).stdout
                run = json.loads(out.strip().splitlines()[-1])
                if key not in best or run["elapsed"] < best[key]["elapsed"]:
                    best[key] = run
    print(f"CPU {cpu}; load average {os.getloadavg()[0]:.2f}; {STEPS} decode steps, best of {args.repeats}")
    print("| batch | scheduling | mp ms / step | ray ms / step | ray / mp |")
    print("|---:|---|---:|---:|---:|")
    for batch in map(int, args.batches.split(",")):
        for flag, name in (("0", "sync"), ("1", "async")):
            mp, ray = best[("mp", batch, flag)]["step_ms"], best[("ray", batch, flag)]["step_ms"]
            print(f"| {batch} | {name} | {mp:.2f} | {ray:.2f} | {ray / mp:.2f}x |")


if __name__ == "__main__":
    main()
