"""The CPU attention backend's C kernels per ISA level: decode and prefill over cached context.

SmolLM2-135M's heads (9 query, 3 KV, head size 64), blocks of 16 scattered over a random
cache, one layer: a batch of decodes, and chunks of new tokens over a long cached context
(chunked prefill, a prefix-cache hit). Each case runs the ``cpu`` backend's ``forward``
(the new keys' store, the plan and the kernel) with the kernels of each level the CPU
supports, levels alternated, best of ``--repeat``. ``--baseline REV`` also builds the whole
kernel library of git revision ``REV`` at each level (``cpu_kernels``' own build of REV's
``csrc``) and times it in the same alternation (``avx512@REV``, ...), printing ``REV / now``
per level and whether the two gave bit-identical outputs.

    python benchmarks/cpu_attention_isa.py --threads 1
    python benchmarks/cpu_attention_isa.py --threads 1 --baseline HEAD~1
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from forkless import cpu_kernels
from forkless.attention import get_attention_backend

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "models"))
from test_cpu_kernels import _paged_step  # noqa: E402 - the tests' random paged cache

from cpu_linear_isa import revision_sources  # noqa: E402 - this folder is first on sys.path

CASES = {
    "decode, 64 sequences of 300": [(299, 1)] * 64,
    "decode, 64 sequences of 1,000": [(999, 1)] * 64,
    "prefill, 64 new over 4,000 cached": [(4000, 64)],
    "prefill, 512 new over 1,500 cached": [(1500, 512)],
}


def load_revision(rev: str, level: str, out_dir: Path) -> ctypes.CDLL:
    """The kernel library of git revision ``rev`` built for ``level`` by ``cpu_kernels``' own
    build (its sources swapped for REV's while it builds and loads)."""
    src = revision_sources(rev, out_dir / "csrc")
    here = cpu_kernels._CSRC
    cpu_kernels._CSRC = src
    cpu_kernels._load_level.cache_clear()
    try:
        lib = cpu_kernels._load_level(level)
    finally:
        cpu_kernels._CSRC = here
        cpu_kernels._load_level.cache_clear()
    if lib is None:
        raise SystemExit(f"the kernels of {rev} did not build for {level} (see the log above)")
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--baseline", metavar="REV", help="also time git revision REV's kernels (REV / now per level)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    levels = [level for level in cpu_kernels.supported_isas() if level != "portable"]
    print(f"CPU: {cpu_kernels.cpu_model()}; ISA levels: {', '.join(levels)}; threads={args.threads}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    libs = {level: cpu_kernels.load_isa(level) for level in levels}
    if args.baseline:
        tmp = Path(tempfile.mkdtemp(prefix="forkless-attn-baseline-"))
        for level in levels:
            libs[f"{level}@{args.baseline}"] = load_revision(args.baseline, level, tmp / level)
    names = list(libs)
    for name, seqs in CASES.items():
        cache, md, q, k, v = _paged_step(9, 3, 64, 16, seqs)
        backend = get_attention_backend("cpu")(9, 3, 64, 64**-0.5)
        best = {key: float("inf") for key in names}
        outs = {}
        for r in range(args.repeat + 1):  # the first round warms up
            for key in names if r % 2 == 0 else names[::-1]:
                cpu_kernels.load = lambda lib=libs[key]: lib  # what the backend calls
                meta = md()
                t0 = time.perf_counter()
                outs[key] = backend.forward(q, k, v, cache, meta)
                if r:
                    best[key] = min(best[key], time.perf_counter() - t0)
        cells = ", ".join(f"{key} {best[key] * 1e3:.2f} ms" for key in names)
        ratio = f"; {levels[-1]} / {levels[0]}: {best[levels[-1]] / best[levels[0]]:.2f}x" if len(levels) > 1 else ""
        if args.baseline:
            ratio += "".join(f"; {level}@{args.baseline} / {level}: "
                             f"{best[f'{level}@{args.baseline}'] / best[level]:.2f}x"
                             f" (bit-identical {torch.equal(outs[level], outs[f'{level}@{args.baseline}'])})"
                             for level in levels)
        print(f"{name}: {cells}{ratio}", flush=True)


if __name__ == "__main__":
    main()
