"""Tensor parallelism on the CPU: per-rank weight memory, and what the collectives cost a step.

Three measurements, one command:

* **Weights per rank**, from the model classes themselves: each shape is built on the
  ``meta`` device as rank 0 and rank 1 of ``-tp 2``, and as stage 0 and 1 of ``-pp 2`` (and
  rank 0 of ``-tp 8`` / ``16`` and stage 0 / 1 of ``-tp 8 -pp 2`` for the 70B shape) and its
  parameters counted, against ``-tp 1``; plus the KV-cache bytes per token a rank holds (its
  KV heads of its layers only).
* **A decode step**, ``-tp 1`` vs ``-tp 2``: an offline ``LLM`` on the ``mp`` executor
  (both, so both pay the same process hop) on Qwen3-0.6B's width with ``--layers`` layers,
  random weights (``load_format="dummy"``), ``--batch`` requests of ``--tokens`` greedy
  tokens; the time per decode step, best of ``--repeats``. ``-tp 1`` runs with one thread
  (``--num-threads 1``) and with two (``--num-threads 2``: as many cores as ``-tp 2`` uses);
  ``-tp 2`` with one thread per rank (the ``mp`` default on two cores).
* **The collectives of one step in isolation**: two gloo processes run exactly the
  collectives a ``-tp 2`` decode step of that model runs (two all-reduces of
  ``[batch, hidden]`` per layer, one for the embedding, the all-gather of the logits
  ``[batch, vocab / 2]``), best of ``--repeats`` x 50 steps; their share of the ``-tp 2``
  step.

    python benchmarks/tp.py [--layers 4] [--batch 4] [--tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
    "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 8192,
    "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
    "attention_bias": False, "bos_token_id": 128000, "eos_token_id": 128001,
}


def weights_per_rank(folder: Path, tp: int, rank: int, dtype: str, pp: int = 1, stage: int = 0) -> tuple[int, int]:
    """``(parameter bytes, KV bytes per token)`` of TP rank ``rank`` of ``tp`` on stage
    ``stage`` of ``pp``, built on meta."""
    import torch

    from forkless.distributed import parallel_state as ps
    from forkless.attention import get_attention_backend
    from forkless.models.hf_config import load_hf_config
    from forkless.models.registry import ModelRegistry

    hf = load_hf_config(folder)
    cls, _ = ModelRegistry.resolve_model_cls(hf.architectures)
    saved = ps._TP, ps._PP
    ps._TP = ps.GroupCoordinator(list(range(tp)), rank, name="tp") if tp > 1 else None
    ps._PP = ps.GroupCoordinator(list(range(pp)), stage, name="pp") if pp > 1 else None
    try:
        with torch.device("meta"):
            model = cls(hf, getattr(torch, dtype), get_attention_backend("torch"))
    finally:
        ps._TP, ps._PP = saved
    size = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    params = sum(p.numel() for p in model.parameters()) * size
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * size
    return params, kv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collectives_rank(rank: int, init: str, hidden: int, vocab: int, layers: int, batch: int, repeats: int,
                      out: str) -> None:
    import torch

    from forkless.distributed import parallel_state as ps

    torch.set_num_threads(1)
    ps.init_parallel_state(world_size=2, rank=rank, tensor_parallel_size=2, pipeline_parallel_size=1,
                           init_method=init, device=torch.device("cpu"), dist_backend="gloo", communicator="gloo")
    tp = ps.get_tp_group()
    x, logits = torch.randn(batch, hidden), torch.randn(batch, -(-vocab // 2))

    def reduces() -> None:
        for _ in range(2 * layers + 1):  # o_proj and the MLP per layer, and the embedding
            tp.all_reduce(x.clone())

    def gather() -> None:
        tp.all_gather(logits, dim=-1)

    best = {}
    for name, step in (("all_reduce", reduces), ("all_gather", gather)):
        for _ in range(5):
            step()
        best[name] = float("inf")
        for _ in range(repeats):
            tp.broadcast(torch.zeros(1))  # both ranks start together
            start = time.perf_counter()
            for _ in range(50):
                step()
            best[name] = min(best[name], (time.perf_counter() - start) / 50 * 1000)
    ps.destroy_parallel_state()
    Path(out, f"rank{rank}").write_text(json.dumps(best))


def collectives_ms(hidden: int, vocab: int, layers: int, batch: int, repeats: int) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    init = f"tcp://127.0.0.1:{_free_port()}"
    with tempfile.TemporaryDirectory() as out:
        procs = [ctx.Process(target=_collectives_rank, args=(r, init, hidden, vocab, layers, batch, repeats, out))
                 for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        ranks = [json.loads(Path(out, f"rank{r}").read_text()) for r in range(2)]
        return {name: max(r[name] for r in ranks) for name in ranks[0]}


def decode_step_ms(folder: Path, tp: int, batch: int, tokens: int, repeats: int, threads: int | None = None) -> float:
    from forkless import LLM, SamplingParams

    llm = LLM(model=str(folder), load_format="dummy", tensor_parallel_size=tp, distributed_executor_backend="mp",
              max_model_len=256, kv_cache_memory=256 << 20, max_num_seqs=batch, num_threads=threads)
    try:
        prompts = [{"prompt_token_ids": [100 + 7 * i + j for j in range(8)]} for i in range(batch)]
        best = float("inf")
        for _ in range(repeats):
            for n in (1, tokens + 1):  # two runs: the decode steps are the difference
                start = time.perf_counter()
                llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True), use_tqdm=False)
                if n == 1:
                    first = time.perf_counter() - start
            best = min(best, (time.perf_counter() - start - first) / tokens)
        return best * 1000
    finally:
        llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from forkless.bench.shapes import SHAPES, write_model_folder

    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        folders = {name: write_model_folder(Path(tmp, name), name, dtype="bfloat16") for name in SHAPES}
        folders["llama-70b"] = Path(tmp, "llama-70b")
        folders["llama-70b"].mkdir()
        (folders["llama-70b"] / "config.json").write_text(json.dumps(LLAMA_70B))
        print("\nweights per rank (bf16, the model classes built on meta):")
        print(f"{'shape':<12} {'tp':>3} {'pp':>3} {'rank':>4} {'stage':>5} {'weights GiB':>12} {'x tp=1':>7} "
              f"{'KV KiB/token':>13}")
        for name, folder in folders.items():
            full, full_kv = weights_per_rank(folder, 1, 0, "bfloat16")
            cases = [(2, 0, 1, 0), (2, 1, 1, 0), (1, 0, 2, 0), (1, 0, 2, 1)]
            if name == "llama-70b":
                cases += [(8, 0, 1, 0), (16, 0, 1, 0), (8, 0, 2, 0), (8, 0, 2, 1)]
            for tp, rank, pp, stage in [(1, 0, 1, 0)] + cases:
                got, kv = weights_per_rank(folder, tp, rank, "bfloat16", pp, stage)
                print(f"{name:<12} {tp:>3} {pp:>3} {rank:>4} {stage:>5} {got / 2**30:>12.3f} {got / full:>7.3f} "
                      f"{kv / 1024:>13.1f}")
        folder = write_model_folder(Path(tmp, "step"), "qwen3-0.6b", dtype="float32", num_layers=args.layers)
        shape = SHAPES["qwen3-0.6b"]
        one = decode_step_ms(folder, 1, args.batch, args.tokens, args.repeats, threads=1)
        one_two_threads = decode_step_ms(folder, 1, args.batch, args.tokens, args.repeats, threads=2)
        two = decode_step_ms(folder, 2, args.batch, args.tokens, args.repeats)
        comm = collectives_ms(shape["hidden_size"], shape["vocab_size"], args.layers, args.batch, args.repeats)
    print(f"\ndecode step, qwen3-0.6b width, {args.layers} layers, float32, batch {args.batch}, "
          f"{args.tokens} tokens, best of {args.repeats}:")
    print(f"  -tp 1 (1 thread): {one:8.2f} ms")
    print(f"  -tp 1 (2 threads): {one_two_threads:8.2f} ms   ({one_two_threads / one:.2f}x -tp 1 with 1 thread)")
    print(f"  -tp 2 (1 thread each): {two:8.2f} ms   ({two / one:.2f}x -tp 1 with 1 thread, "
          f"{two / one_two_threads:.2f}x with 2)")
    print(f"  its {2 * args.layers + 1} all-reduces of [{args.batch}, {shape['hidden_size']}] alone: "
          f"{comm['all_reduce']:.2f} ms = {100 * comm['all_reduce'] / two:.1f} % of the -tp 2 step")
    print(f"  its all-gather of the logits [{args.batch}, {-(-shape['vocab_size'] // 2)}] alone: "
          f"{comm['all_gather']:.2f} ms = {100 * comm['all_gather'] / two:.1f} % of the -tp 2 step")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
