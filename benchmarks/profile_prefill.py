"""Where the offline throughput workload's prefill goes: its 512 prompts alone, kernels by name.

Runs the prompts of ``forkless bench throughput``'s workload (512 requests, 100-1,024
tokens, seed 0; Qwen3-0.6B shape, bf16, dummy weights, async scheduling, prefix caching
off so every run computes every prompt) with ``max_tokens=1``: the prefill steps and
nothing else. Prints the wall time of three runs, then one run under ``torch.profiler``:
the GPU's kernel time in all, grouped into GEMMs, attention and the rest, and the top
kernels.

    python benchmarks/profile_prefill.py [--max-num-batched-tokens 8192]

Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from forkless import LLM, SamplingParams
    from forkless.bench.shapes import write_model_folder
    from forkless.bench.throughput import make_workload

    with tempfile.TemporaryDirectory() as tmp:
        model = write_model_folder(Path(tmp) / "qwen3-0.6b", "qwen3-0.6b", dtype="bfloat16")
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        work = make_workload(512, (100, 1024), (100, 1024), vocab, 0)
        llm = LLM(str(model), dtype="bfloat16", load_format="dummy", max_num_seqs=512, async_scheduling=True,
                  max_model_len=2064, max_num_batched_tokens=args.max_num_batched_tokens,
                  enable_prefix_caching=False)
        prompts = [{"prompt_token_ids": p} for p, _ in work]
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)

        def run() -> float:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            torch.cuda.synchronize()
            return time.perf_counter() - t0

        run()  # compiles what the capture did not
        walls = [run() for _ in range(3)]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
        llm.shutdown()
    print(f"{torch.cuda.get_device_name()}; prefill of {sum(len(p) for p, _ in work)} tokens, "
          f"--max-num-batched-tokens {args.max_num_batched_tokens}: wall " + ", ".join(f"{w:.3f}" for w in walls) + " s")
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    groups: dict[str, float] = {}
    for e in events:
        group = ("GEMM" if any(s in e.key for s in ("nvjet", "gemm", "cutlass", "splitK")) else
                 "attention" if "paged_attention" in e.key else "rest")
        groups[group] = groups.get(group, 0.0) + e.self_device_time_total
    total = sum(groups.values())
    print(f"GPU kernel time {total / 1e6:.3f} s: " + ", ".join(f"{g} {t / 1e6:.3f} s" for g, t in groups.items()))
    for e in events[: args.top]:
        print(f"{e.key[:80]:80s} {e.self_device_time_total / 1e3:9.1f} ms {e.count:6d} calls")


if __name__ == "__main__":
    main()
