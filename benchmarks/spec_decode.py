"""Speculative decoding against plain decoding, on the same requests.

Two workloads, each run on a fresh ``LLM`` without and with each ``--methods`` entry,
interleaved, ``--repeats`` times:

* ``ngram``: ``{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1,
  "prompt_lookup_max": 4}``;
* ``draft-same``: ``{"method": "draft_model", "model": MODEL, ...}``, the model as its own
  draft: every guess is accepted, so it shows the mechanics (K + 1 tokens a target step)
  and what the draft's K passes cost when the draft is as large as the target;
* ``draft-layers``: a draft made of the model's first ``--draft-layers`` layers (and its
  embeddings, final norm and LM head; written to a temporary folder): a smaller model of
  the same tokenizer, untrained as a draft.

The workloads:

* ``copy``: "Repeat the following text exactly" prompts over passages of a fixed English
  text (``benchmarks/data/copy_text.txt``, a frozen copy of an early version of this
  repository's architecture notes: prose with identifiers, as users paste), so the output
  copies the prompt (prompt lookup's best case). Fixed so that editing the docs does not
  move the benchmark;
* ``no-repeat``: prompts of random token ids and sampled output (temperature 1, no
  top-k / top-p: still speculated), with no reason to repeat anything -- prompt lookup's
  worst case, where drafts cost verification and little is accepted. (Greedy decoding of
  random prompts falls into loops that prompt lookup predicts well, so it would flatter.)

At batch 1 (one request at a time) and batch 8 (8 at once). Each repeat runs plain
decoding and then each method, so that a ratio compares runs a few seconds apart (a
3-second run on a shared 2-core machine swings by +-5 %); printed are the medians over
the repeats of the output tokens per second and of the per-repeat ratios with / without
(with their range), and the acceptance (mean tokens a draft sequence yields, its own
token included; the share of draft tokens accepted).

    python benchmarks/spec_decode.py                 # the default model, this machine's CPU
    python benchmarks/spec_decode.py --model PATH --k 4 --max-tokens 128
    python benchmarks/spec_decode.py --async-scheduling   # both sides with async steps
    python benchmarks/spec_decode.py --methods ngram --workloads no-repeat --batches 8 --repeats 9

The issue's bars (ngram): copy at batch 1 >= 1.8x, no-repeat never below 0.95x.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def copy_prompts(n: int) -> list[str]:
    """Chat-free "repeat this" prompts over passages of the fixed text (80-120 words each)."""
    text = " ".join((REPO / "benchmarks" / "data" / "copy_text.txt").read_text().split())
    words = text.split(" ")
    rng = random.Random(0)
    out = []
    for _ in range(n):
        start = rng.randrange(0, len(words) - 150)
        passage = " ".join(words[start : start + rng.randrange(80, 120)])
        out.append(f"Repeat the following text exactly.\n\nText: {passage}\n\nRepeated text: {passage[:40]}")
    return out


def run(model: str, prompts: list, batch: int, spec: dict | None, args: argparse.Namespace,
        random_ids: bool) -> tuple[float, dict | None]:
    from forkless import LLM, SamplingParams

    llm = LLM(model, max_model_len=2048, speculative_config=spec, seed=0, dtype=args.dtype,
              async_scheduling=args.async_scheduling)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0 if random_ids else 0, ignore_eos=True)
    inputs = [{"prompt_token_ids": p} for p in prompts] if random_ids else prompts
    llm.generate(inputs[:1], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)  # warm-up
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(inputs), batch):
        outs = llm.generate(inputs[i : i + batch], params, use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    elapsed = time.perf_counter() - start
    stats = llm.llm_engine.engine_core.make_stats().spec_decode
    llm.shutdown()
    acc = None
    if stats is not None and stats.num_drafts:
        acc = {"mean_acceptance_length": 1 + stats.num_accepted_tokens / stats.num_drafts,
               "accepted_share": stats.num_accepted_tokens / max(stats.num_draft_tokens, 1)}
    return tokens / elapsed, acc


def layer_draft(model: str, layers: int, out: Path) -> str:
    """A copy of ``model`` that keeps only its first ``layers`` decoder layers."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    src = Path(model)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix in (".json", ".jinja") and f.name != "forkless_gguf.json":
            shutil.copy(f, out / f.name)
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(config))
    weights = {}
    for f in sorted(src.glob("*.safetensors")):
        for name, tensor in load_file(f).items():
            parts = name.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= layers:
                continue
            weights[name] = tensor
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return str(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--methods", nargs="+", default=["ngram", "draft-same", "draft-layers"],
                        choices=["ngram", "draft-same", "draft-layers"])
    parser.add_argument("--draft-layers", type=int, default=6, help="layers of the draft-layers draft")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case; medians are printed")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--workloads", nargs="+", default=["copy", "no-repeat"], choices=["copy", "no-repeat"])
    parser.add_argument("--dtype", default="auto", help="model dtype (auto: float32 on the CPU)")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="both sides with --async-scheduling (the baseline overlaps its steps too)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    if args.model is None:
        from forkless.model_loader.default_model import default_model_path

        args.model = str(default_model_path())
    import tempfile

    specs = {
        "ngram": {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 1, "prompt_lookup_max": 4},
        "draft-same": {"method": "draft_model", "model": args.model, "num_speculative_tokens": args.k},
    }
    if "draft-layers" in args.methods:
        folder = layer_draft(args.model, args.draft_layers, Path(tempfile.mkdtemp()) / "draft")
        specs["draft-layers"] = {"method": "draft_model", "model": folder, "num_speculative_tokens": args.k}
    rng = random.Random(1)
    workloads = {
        "copy": (copy_prompts(args.num_prompts), False),
        "no-repeat": ([[rng.randrange(100, 40000) for _ in range(64)] for _ in range(args.num_prompts)], True),
    }
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"model {args.model}, CPU {cpu}, torch threads {torch.get_num_threads()}, k {args.k}, "
          f"{args.num_prompts} prompts x {args.max_tokens} tokens, {args.repeats} repeats (medians); "
          f"copy greedy, no-repeat sampled{'; --async-scheduling on both sides' if args.async_scheduling else ''}")
    print("| workload | batch | method | plain tok/s | spec tok/s | ratio (median) | ratio range "
          "| mean acceptance length | drafts accepted |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for name in args.workloads:
        prompts, random_ids = workloads[name]
        for batch in args.batches:
            plain: list[float] = []
            fast: dict[str, list[float]] = {m: [] for m in args.methods}
            ratios: dict[str, list[float]] = {m: [] for m in args.methods}
            acc: dict = {}
            for _ in range(args.repeats):
                # Each method's ratio against the plain run just before it.
                plain.append(run(args.model, prompts, batch, None, args, random_ids)[0])
                for method in args.methods:
                    rate, acc[method] = run(args.model, prompts, batch, specs[method], args, random_ids)
                    fast[method].append(rate)
                    ratios[method].append(rate / plain[-1])
            for method in args.methods:
                a = acc[method] or {"mean_acceptance_length": 1.0, "accepted_share": 0.0}
                r = ratios[method]
                print(f"| {name} | {batch} | {method} | {statistics.median(plain):.1f} | "
                      f"{statistics.median(fast[method]):.1f} | **{statistics.median(r):.2f}x** | "
                      f"{min(r):.2f}-{max(r):.2f} | {a['mean_acceptance_length']:.2f} | "
                      f"{100 * a['accepted_share']:.0f} % |", flush=True)


if __name__ == "__main__":
    main()
