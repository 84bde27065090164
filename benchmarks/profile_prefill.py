"""Where the offline throughput workload's prefill goes: its 512 prompts alone, kernels by name.

Runs the prompts of ``forkless bench throughput``'s workload (512 requests, 100-1,024
tokens, seed 0; Qwen3-0.6B shape, bf16, dummy weights, async scheduling, prefix caching
off so every run computes every prompt) with ``max_tokens=1``: the prefill steps and
nothing else. Prints the wall time of three runs, then one run under ``torch.profiler``:
the GPU's kernel time in all, grouped as ``benchmarks/attention_bw.py --step-profile``
groups a decode step's, and the top kernels.

    python benchmarks/profile_prefill.py [--max-num-batched-tokens 8192]

Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_bw import dev_time, kernel_groups  # noqa: E402  (benchmarks/attention_bw.py)


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
    events = [e for e in prof.key_averages() if dev_time(e) > 0]
    events.sort(key=dev_time, reverse=True)
    groups = kernel_groups(events)
    print(f"GPU kernel time {sum(groups.values()) / 1e6:.3f} s")
    for g, t in groups.items():
        print(f"  {g:50s} {t / 1e6:7.3f} s")
    for e in events[: args.top]:
        print(f"{e.key[:80]:80s} {dev_time(e) / 1e3:9.1f} ms {e.count:6d} calls")


if __name__ == "__main__":
    main()
