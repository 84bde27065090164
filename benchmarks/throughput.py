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
"""

from __future__ import annotations

import argparse
import json
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
              kv_cache_memory=args.kv_cache_gib << 30, enable_prefix_caching=False)
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
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from forkless.model_loader.default_model import default_model_path

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
    print(f"model={args.model or 'default (SmolLM2-135M)'} n={len(work)} input={args.input_len} "
          f"output={args.output_len} threads={args.threads} hf_batch={args.hf_batch_size}", flush=True)

    f_s, f_tok = run_forkless(model, work, args)
    print(f"forkless:     {f_tok} tokens in {f_s:7.2f} s = {f_tok / f_s:8.1f} output tok/s", flush=True)
    if not args.skip_hf:
        h_s, h_tok = run_transformers(model, work, args)
        print(f"transformers: {h_tok} tokens in {h_s:7.2f} s = {h_tok / h_s:8.1f} output tok/s")
        print(f"ratio forkless / transformers: {(f_tok / f_s) / (h_tok / h_s):.2f}x")
    if tmp is not None:
        tmp.cleanup()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
