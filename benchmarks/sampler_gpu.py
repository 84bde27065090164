"""The sampler's GPU time per decode step at the throughput workload's batch, by sampling kind.

One step's sampling over ``[rows, vocab]`` bf16 logits (default 512 x 151,936, Qwen3's
vocabulary at ``--max-num-seqs 512``), timed with CUDA events, median of ``--repeat``
steps after a warm-up, for:

* greedy (``temperature=0``: the argmax of the bf16 logits);
* temperature only (the API's default sampling), the one-pass race (``race_triton``);
* the same rows through the PyTorch race (float32 copy, softmax, noise, argmax), as the
  sampler ran them before the one-pass race and still runs them with top-k / top-p;
* ``top_p=0.9``: the top-p race (``race_rows_top_k_top_p``), and the PyTorch race after a sort;
* ``top_k=20, top_p=0.95`` (Qwen3's ``generation_config.json``, which the server applies to
  every request by default) and ``top_k=50`` alone: the same two ways;
* Qwen3's defaults with ``min_p=0.05``: all in the race kernel (min_p a threshold below
  the row's max), min_p as the built-in processor's PyTorch ops on a float32 copy and then
  the kernel (as the sampler ran it before), or a sort;
* the top-k kernel alone (``race_rows_top_k_top_p``) with its candidate list (the default)
  and without it (``candidates=0``: the radix select, and every pass over the whole row).

Each line gives the time and its ratio to the plain PyTorch race, measured in the same run
(the top-k / top-p lines: compare each pair with each other); ``--json`` writes the numbers. The logits
are random (near-uniform rows: top-p keeps ~80 % of a row), a hard case for the top-p race's
rounds only if the winner falls outside the set, which it does with probability 1 - top_p.

    python benchmarks/sampler_gpu.py [--rows 512] [--vocab 151936] [--repeat 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _time(fn, repeat: int) -> float:
    import torch

    for _ in range(5):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    from forkless import SamplingParams
    from forkless.logits_processors import build_logits_processors
    from forkless.sample import InputBatch, Sampler

    if not torch.cuda.is_available():
        raise SystemExit("sampler_gpu.py needs a CUDA device")
    device = torch.device("cuda")
    logits = torch.randn(args.rows, args.vocab, device=device).to(torch.bfloat16)

    def metadata_of(params: SamplingParams):
        procs = build_logits_processors(None, device, False, None, entry_points=False)
        batch = InputBatch(max_num_reqs=args.rows, vocab_size=args.vocab, device="cuda", logits_processors=procs)
        for i in range(args.rows):
            batch.add_request(f"r{i}", params, [1, 2, 3])
        return batch.refresh()

    sampler = Sampler()

    class TorchRace(Sampler):
        """The sampler with the race kernels turned off: the PyTorch ops they replaced."""

        @staticmethod
        def races_in_one_pass(logits, metadata) -> bool:
            return False

        @staticmethod
        def _races_on(logits) -> bool:
            return False

    class ProcessorsThenRace(Sampler):
        """The general path: processors as PyTorch ops on a float32 copy, then the kernels."""

        @staticmethod
        def races_in_one_pass(logits, metadata) -> bool:
            return False

    plain = metadata_of(SamplingParams(temperature=0.8))
    top_p = metadata_of(SamplingParams(temperature=0.8, top_p=0.9))
    qwen = metadata_of(SamplingParams(temperature=0.6, top_k=20, top_p=0.95))
    top_k = metadata_of(SamplingParams(temperature=0.8, top_k=50))
    min_p = metadata_of(SamplingParams(temperature=0.6, top_k=20, top_p=0.95, min_p=0.05))
    kinds = {
        "greedy": (sampler, metadata_of(SamplingParams(temperature=0))),
        "temperature, one-pass race": (sampler, plain),
        "temperature, PyTorch race": (TorchRace(), plain),
        "top_p=0.9, race": (sampler, top_p),
        "top_p=0.9, PyTorch (sort)": (TorchRace(), top_p),
        "top_k=20 top_p=0.95, race": (sampler, qwen),
        "top_k=20 top_p=0.95, PyTorch": (TorchRace(), qwen),
        "top_k=50, race": (sampler, top_k),
        "top_k=50, PyTorch (topk)": (TorchRace(), top_k),
        "+ min_p=0.05, race": (sampler, min_p),
        "+ min_p=0.05, PyTorch min_p then race": (ProcessorsThenRace(), min_p),
        "+ min_p=0.05, PyTorch": (TorchRace(), min_p),
    }
    assert all(Sampler.races_in_one_pass(logits, m) for m in (plain, top_p, qwen, top_k, min_p))
    from forkless.sample.race_triton import CANDIDATES, race_rows_top_k_top_p

    temps = torch.full((args.rows,), 0.6, device=device)
    ks = {k: torch.full((args.rows,), k, device=device, dtype=torch.int64) for k in (20, 50, 200)}
    p95 = torch.full((args.rows,), 0.95, device=device)
    kernel = {f"kernel top_k={k}{' top_p=0.95' if p is not None else ''}, {how}":
              (lambda k=k, p=p, c=c: race_rows_top_k_top_p(logits.clone(), temps, ks[k], p, candidates=c))
              for k, p in ((20, p95), (50, None), (200, None)) for how, c in (("list", CANDIDATES), ("radix", 0))}
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; logits [{args.rows}, {args.vocab}] bf16; "
          f"median of {args.repeat} steps")
    results = {name: _time(lambda s=s, m=m: s(logits.clone(), m), args.repeat) for name, (s, m) in kinds.items()}
    results.update({name: _time(fn, args.repeat) for name, fn in kernel.items()})
    clone = _time(lambda: logits.clone(), args.repeat)  # each timed step includes this copy
    base = results["temperature, PyTorch race"]
    for name, ms in results.items():
        print(f"{name:40s} {ms:7.3f} ms  ({ms / base:.2f}x the PyTorch race)")
    print(f"{'(the logits copy in each)':40s} {clone:7.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"ms": results, "clone_ms": clone, "rows": args.rows,
                                               "vocab": args.vocab, "device": torch.cuda.get_device_name()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
