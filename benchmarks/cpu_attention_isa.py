"""The CPU attention backend's C kernels per ISA level: decode and prefill over cached context.

SmolLM2-135M's heads (9 query, 3 KV, head size 64), blocks of 16 scattered over a random
cache, one layer: a batch of decodes, and chunks of new tokens over a long cached context
(chunked prefill, a prefix-cache hit). Each case runs the ``cpu`` backend's ``forward``
(the new keys' store, the plan and the kernel) with the kernels of each level the CPU
supports, levels alternated, best of ``--repeat``.

    python benchmarks/cpu_attention_isa.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from forkless import cpu_kernels
from forkless.attention import get_attention_backend

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "models"))
from test_cpu_kernels import _paged_step  # noqa: E402 - the tests' random paged cache

CASES = {
    "decode, 64 sequences of 300": [(299, 1)] * 64,
    "prefill, 64 new over 4,000 cached": [(4000, 64)],
    "prefill, 512 new over 1,500 cached": [(1500, 512)],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    levels = [level for level in cpu_kernels.supported_isas() if level != "portable"]
    print(f"CPU: {cpu_kernels.cpu_model()}; ISA levels: {', '.join(levels)}; threads={args.threads}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    libs = {level: cpu_kernels.load_isa(level) for level in levels}
    for name, seqs in CASES.items():
        cache, md, q, k, v = _paged_step(9, 3, 64, 16, seqs)
        backend = get_attention_backend("cpu")(9, 3, 64, 64**-0.5)
        best = {level: float("inf") for level in levels}
        for r in range(args.repeat + 1):  # the first round warms up
            for level in levels if r % 2 == 0 else levels[::-1]:
                cpu_kernels.load = lambda lib=libs[level]: lib  # what the backend calls
                meta = md()
                t0 = time.perf_counter()
                backend.forward(q, k, v, cache, meta)
                if r:
                    best[level] = min(best[level], time.perf_counter() - t0)
        cells = ", ".join(f"{level} {best[level] * 1e3:.2f} ms" for level in levels)
        ratio = f"; {levels[-1]} / {levels[0]}: {best[levels[-1]] / best[levels[0]]:.2f}x" if len(levels) > 1 else ""
        print(f"{name}: {cells}{ratio}", flush=True)


if __name__ == "__main__":
    main()
