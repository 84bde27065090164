"""Where a decode step's GPU time goes: kernels by total time, launches per step.

Runs batch-1 (or ``--batch``) greedy decoding of a model of a known shape under
``torch.profiler`` and prints the top kernels, the GPU's busy time per step (sum of
kernel times) and the wall time per step. The gap between the two is host time the
device waited for; kernel counts show what fusion would remove.

    python benchmarks/profile_decode.py --shape llama3-8b --dtype bfloat16 [--enforce-eager]
    python benchmarks/profile_decode.py --shape qwen3-0.6b --batch 64 --lora-adapters 8  # multi-LoRA

``--gaps`` also prints where the device sat idle between kernels (the last 80 % of the
profiled run, past its prefill): the idle time per step and the kernel pairs it fell
between.

``--lora-adapters N`` spreads the batch round-robin over N random rank-``--lora-rank``
adapters on every projection (as ``benchmarks/lora.py`` writes them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama3-8b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--lora-adapters", type=int, default=0)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--gaps", action="store_true", help="print the device's idle gaps between kernels")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from forkless import LLM, SamplingParams
    from forkless.bench.shapes import write_model_folder

    with tempfile.TemporaryDirectory() as tmp:
        model = write_model_folder(Path(tmp) / args.shape, args.shape, dtype=args.dtype)
        loras, lora_args = None, {}
        if args.lora_adapters:
            import json

            from forkless.lora import LoRARequest

            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from lora import write_adapter  # benchmarks/lora.py

            hf = json.loads((model / "config.json").read_text())
            loras = [LoRARequest(f"a{i}", i + 1, str(write_adapter(Path(tmp) / f"a{i}", hf, args.lora_rank, i)))
                     for i in range(args.lora_adapters)]
            loras = [loras[j % len(loras)] for j in range(args.batch)]
            lora_args = dict(enable_lora=True, max_loras=args.lora_adapters, max_lora_rank=args.lora_rank)
        llm = LLM(str(model), dtype=args.dtype, load_format="dummy", max_num_seqs=max(args.batch, 1),
                  enforce_eager=args.enforce_eager, async_scheduling=args.async_scheduling, **lora_args)
        prompts = [{"prompt_token_ids": [100 + i + j for i in range(args.prompt_len)]}
                   for j in range(args.batch)]

        def run(n: int) -> float:
            params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
            t0 = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
            return time.perf_counter() - t0

        run(8)
        wall = (run(args.steps + 1) - run(1)) / args.steps
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(args.steps + 1)
        llm.shutdown()

    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or
              getattr(e, "self_device_time_total", 0) > 0]
    def dev_time(e) -> float:
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
    events.sort(key=dev_time, reverse=True)
    total = sum(dev_time(e) for e in events)
    steps = args.steps + 1
    print(f"shape={args.shape} dtype={args.dtype} batch={args.batch} lora_adapters={args.lora_adapters} "
          f"eager={args.enforce_eager} async={args.async_scheduling}")
    print(f"wall per decode step: {wall * 1e3:.3f} ms; GPU kernel time per step "
          f"(incl. prefill, /{steps}): {total / steps / 1e3:.3f} ms")
    print(f"{'kernel':70s} {'ms/step':>8s} {'calls/step':>10s}")
    for e in events[: args.top]:
        print(f"{e.key[:70]:70s} {dev_time(e) / steps / 1e3:8.3f} {e.count / steps:10.1f}")
    print(f"kernels per step: {sum(e.count for e in events) / steps:.0f}")
    if args.gaps:
        print_gaps(prof, steps)


def print_gaps(prof, steps: int) -> None:
    """The device's idle time between kernels and copies, by the pair it fell between."""
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type.name == "CUDA")
    if not spans:
        return
    t0, t1 = spans[0][0], max(end for _, end, _ in spans)
    cut = t0 + 0.2 * (t1 - t0)  # past the prefill and the first steps
    spans = [s for s in spans if s[0] >= cut]
    idle, pairs = 0.0, {}
    end, last = spans[0][1], spans[0][2]
    for start, stop, name in spans[1:]:
        if start > end:
            gap = start - end
            idle += gap
            key = f"{last[:40]} -> {name[:40]}"
            total, count = pairs.get(key, (0.0, 0))
            pairs[key] = (total + gap, count + 1)
        if stop > end:
            end, last = stop, name
    span = end - spans[0][0]
    share = span / (t1 - t0)
    print(f"device idle {idle / 1e3:.3f} of {span / 1e3:.3f} ms ({100 * idle / span:.1f} %), "
          f"{idle / (steps * share):.1f} us a step")
    print(f"{'idle between':84s} {'us/step':>8s} {'count/step':>10s}")
    for key, (total, count) in sorted(pairs.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"{key:84s} {total / (steps * share):8.2f} {count / (steps * share):10.2f}")


if __name__ == "__main__":
    main()
