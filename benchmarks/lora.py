"""Multi-LoRA throughput against the base model alone, on the same requests.

64 requests (prompts of 100-300 tokens, 64 output tokens each, greedy, ``ignore_eos``)
are spread round-robin over 8 rank-16 adapters on every q/k/v/o/gate/up/down projection
(random weights, written by this script as PEFT folders), and run once on the base model
alone and once with the adapters, each on a fresh ``LLM`` with the same flags
(``--max-loras 8``: every adapter in one step; the base run without ``--enable-lora``),
after a short warm-up, interleaved, best of ``--repeats`` each. The ratio is LoRA
throughput over base throughput (output tokens per second of wall time).

    python benchmarks/lora.py                     # the default model on this machine
    python benchmarks/lora.py --model PATH --adapters 32 --max-loras 4   # swapping
    python benchmarks/lora.py --shape qwen3-0.6b --load-format dummy --dtype bfloat16  # GPU

``--shape`` writes a model folder of a known shape (``forkless.bench.shapes``; no weights:
use it with ``--load-format dummy``). On CUDA the adapters run on the Triton shrink /
expand kernels inside CUDA-graph decode, as the base model's decode does.

The issue's bar: >= 0.7x the base throughput on CPU (default model), >= 0.8x on the H200
(Qwen3-0.6B shape, dummy weights and adapters).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path


def write_adapter(folder: Path, hf_config: dict, rank: int, seed: int) -> Path:
    """A PEFT LoRA folder for ``hf_config``'s projections, with random weights."""
    import torch
    from safetensors.torch import save_file

    from forkless.lora.peft import llama_lora_shapes

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (fan_in, fan_out) in llama_lora_shapes(hf_config).items():
        key = f"base_model.model.{module}"
        tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) / fan_in**0.5
        tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * 0.01
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
              "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def run(model: str | None, prompts: list[list[int]], loras: list, args: argparse.Namespace) -> float:
    """Output tokens per second of one ``LLM`` over every prompt (after a warm-up)."""
    from forkless import LLM, SamplingParams

    # The base run is a plain engine (no --enable-lora), as a user without adapters runs it.
    lora_args = dict(enable_lora=True, max_loras=args.max_loras, max_lora_rank=args.rank,
                     max_cpu_loras=max(args.max_loras, args.adapters)) if loras else {}
    engine_args: dict = dict(load_format=args.load_format, dtype=args.dtype, async_scheduling=args.async_scheduling,
                             enforce_eager=args.enforce_eager)
    if args.max_model_len:
        engine_args["max_model_len"] = args.max_model_len
    llm = LLM(model, max_num_seqs=args.num_requests, enable_prefix_caching=False, **engine_args, **lora_args)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
        warm = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        # Warm-up: kernels, allocator, and every adapter loaded once.
        llm.generate([{"prompt_token_ids": p} for p in prompts[: len(loras) or 1]], warm, use_tqdm=False,
                     lora_request=loras[: len(prompts)] or None)
        started = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                            lora_request=[loras[i % len(loras)] for i in range(len(prompts))] if loras else None)
        elapsed = time.perf_counter() - started
        return sum(len(o.outputs[0].token_ids) for o in outs) / elapsed
    finally:
        llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--max-loras", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each, interleaved; the best counts")
    parser.add_argument("--shape", default=None, help="write a model folder of this known shape (e.g. qwen3-0.6b) "
                        "and use it instead of --model; pair with --load-format dummy")
    parser.add_argument("--load-format", default="auto", help="auto, or dummy (random weights)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (both runs)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()

    from forkless.lora import LoRARequest
    from forkless.model_loader.default_model import resolve_model_path

    shape_dir = tempfile.TemporaryDirectory() if args.shape else None
    if shape_dir is not None:
        from forkless.bench.shapes import write_model_folder

        model_path = write_model_folder(Path(shape_dir.name) / args.shape, args.shape)
    else:
        model_path = resolve_model_path(args.model)
    hf = json.loads((model_path / "config.json").read_text())
    rng = random.Random(0)
    vocab = int(hf["vocab_size"])
    prompts = [[rng.randrange(100, vocab) for _ in range(rng.randint(100, 300))] for _ in range(args.num_requests)]
    with tempfile.TemporaryDirectory() as tmp:
        loras = [LoRARequest(f"adapter-{i}", i + 1, str(write_adapter(Path(tmp) / f"a{i}", hf, args.rank, i)))
                 for i in range(args.adapters)]
        # Interleaved, best of --repeats each: the machine may be shared, and a slow spell
        # should not land on one side only.
        base = lora = 0.0
        for _ in range(args.repeats):
            base = max(base, run(str(model_path), prompts, [], args))
            lora = max(lora, run(str(model_path), prompts, loras, args))
    print(f"{args.num_requests} requests, {args.output_len} output tokens each, {args.adapters} rank-{args.rank} "
          f"adapters, --max-loras {args.max_loras}")
    print(f"base model alone: {base:8.1f} output tok/s")
    print(f"with adapters:    {lora:8.1f} output tok/s")
    print(f"ratio: {lora / base:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({**vars(args), "base_tok_s": base, "lora_tok_s": lora,
                                               "ratio": lora / base}, indent=1))
    if shape_dir is not None:
        shape_dir.cleanup()


if __name__ == "__main__":
    main()
