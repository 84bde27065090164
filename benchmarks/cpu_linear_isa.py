"""The packed linear kernel per ISA level against ``torch.nn.functional.linear``.

The default model's linear layers (SmolLM2-135M: 30 layers of fused qkv [960, 576], o
[576, 576], gate-up [3072, 576], down [576, 1536], then the LM head [49152, 576]), random
float32 weights, each packed once per ISA level the CPU supports (``avx512``, ``avx2``) and
kept unpacked for torch: one pass runs x [rows, in] through every layer in turn, so the
weights stream from memory as in a decode step. The levels and torch take turns within
each repeat (alternated, so load from other processes hits them alike); the best of the
repeats is reported, in ms per pass and GFLOP/s. A prefill size runs through the first
``--prefill-layers`` layers only (no head): it is FMA-bound, not memory-bound.

    python benchmarks/cpu_linear_isa.py                    # torch's thread count
    python benchmarks/cpu_linear_isa.py --threads 1 --rows 1 8 64 --repeat 5
    python benchmarks/cpu_linear_isa.py --torch-bf16     # and torch F.linear on bfloat16 weights
    python benchmarks/cpu_linear_isa.py --threads 1 --rows 1 5 8 --baseline HEAD~1
    python benchmarks/cpu_linear_isa.py --bf16 --rows 1 8 35 64 --prefill-rows 2048   # bfloat16 layers

``--torch-bf16`` adds ``F.linear`` on bfloat16 copies of the weights and input (torch sends
it to oneDNN, which uses AMX where the CPU has it), reordering the weight on every call.
``--bf16`` adds the two packed bfloat16 layers ``--dtype bfloat16`` runs on the CPU
(``forkless.models.layers.cpu_linear``): forkless's AVX512-BF16 kernel (``PackedLinearBF16``,
``bf16-kernel``; its plain loops on a CPU without AVX512-BF16) and prepacked oneDNN
(``OneDNNLinear``, ``bf16-onednn``, where torch's oneDNN runs bfloat16), and the ratio
``bf16-onednn / bf16-kernel``.
``--gguf`` adds the model's GGUF layers as ``--quantization gguf`` runs them (the random
weights quantized to Q4_1, the head to Q8_0, as the default model's file holds them;
``forkless.models.layers.gguf_linear``) per level, with float32 activations
(``gguf-f32@LEVEL``) and with activations rounded to int8 (``gguf-i8@LEVEL``, the default),
and the ratio ``gguf-f32 / gguf-i8`` per level; the int8 route's instruction is printed.
``--baseline REV`` also builds ``linear.c`` of git revision ``REV`` at each level (same
compiler and flags; its ``forkless_linear_f32`` must take today's arguments) and times it
in the same alternation (``avx512@REV``, ...): a before/after comparison in one command,
with the ratio ``REV / now`` per level. Where ``--rows`` holds 1, each row also gives every
column's time against its own 1-row time (``/1 row``: a memory-bound pass reads the same
bytes at any row count, so this is what the extra rows cost).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from forkless import cpu_kernels
from forkless.models.layers.cpu_linear import OneDNNLinear, PackedLinearBF16, onednn_bf16_available
from forkless.models.layers.cpu_linear import PackedLinear

HIDDEN, INTER, KV, VOCAB, LAYERS = 576, 1536, 192, 49152, 30
SHAPES = ((HIDDEN + 2 * KV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER))
CSRC = "forkless/cpu_kernels/csrc"


def revision_sources(rev: str, src: Path) -> Path:
    """The C kernel sources (``forkless/cpu_kernels/csrc``) of git revision ``rev``, written
    to the folder ``src``; returns it."""
    root = Path(__file__).resolve().parent.parent
    src.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{CSRC}"], cwd=root, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        data = subprocess.run(["git", "show", f"{rev}:{CSRC}/{name}"], cwd=root, check=True, capture_output=True).stdout
        (src / name).write_bytes(data)
    return src


def build_revision(rev: str, level: str, out_dir: Path) -> ctypes.CDLL:
    """The linear kernel of git revision ``rev`` built for ``level`` (``cpu_kernels``'
    compiler and flags), loaded; only ``forkless_linear_f32`` and the panel width are used."""
    src = revision_sources(rev, out_dir / f"{level}-src")
    out = out_dir / f"{level}.so"
    cc = os.environ.get("CC") or "cc"
    flags = [*cpu_kernels._BASE_FLAGS, *cpu_kernels.isa_flags(level)]
    if cpu_kernels._is_gcc(cc):
        flags.append("-fopenmp")
    subprocess.run([cc, *flags, "-o", str(out), str(src / "linear.c"), "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    lib.forkless_linear_f32.argtypes = cpu_kernels._SIGNATURES["forkless_linear_f32"]
    lib.forkless_linear_f32.restype = ctypes.c_int
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--prefill-rows", type=int, default=1024)
    ap.add_argument("--prefill-layers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--torch-bf16", action="store_true", help="also F.linear in bfloat16")
    ap.add_argument("--bf16", action="store_true", help="also the packed bfloat16 layers (forkless's, oneDNN's)")
    ap.add_argument("--baseline", metavar="REV", help="also the kernel of git revision REV, per level")
    ap.add_argument("--gguf", action="store_true", help="also the GGUF Q4_1 / Q8_0 layers, float32 and int8 activations")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    levels = [level for level in cpu_kernels.supported_isas() if level != "portable"]
    print(f"CPU: {cpu_kernels.cpu_model()}; ISA levels: {', '.join(levels)}; threads={args.threads}; "
          f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}); load {os.getloadavg()[0]:.2f}",
          flush=True)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) * k**-0.5 for _ in range(LAYERS) for n, k in SHAPES]
    weights.append(torch.randn(VOCAB, HIDDEN, generator=gen) * HIDDEN**-0.5)
    packed = {level: [PackedLinear(w, lib=cpu_kernels.load_isa(level)) for w in weights] for level in levels}
    names = [*levels, "torch"]
    tmp = tempfile.TemporaryDirectory()
    if args.baseline:
        for level in levels:
            lib = build_revision(args.baseline, level, Path(tmp.name))
            packed[f"{level}@{args.baseline}"] = [PackedLinear(w, lib=lib) for w in weights]
            names.append(f"{level}@{args.baseline}")
    if args.torch_bf16:
        names.append("torch-bf16")
        weights_bf16 = [w.bfloat16() for w in weights]
    bf16_layers = {"bf16-kernel": PackedLinearBF16} if args.bf16 else {}
    if args.bf16 and onednn_bf16_available():
        bf16_layers["bf16-onednn"] = OneDNNLinear
    for name, layer in bf16_layers.items():
        packed[name] = [layer(w.bfloat16()) for w in weights]
        names.append(name)
    gguf_levels = levels if args.gguf else []
    if gguf_levels:
        import gguf
        from gguf.quants import quantize

        from forkless.models.layers.gguf_linear import GGUFLinear

        blocks = [quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0 if i == len(weights) - 1 else
                           gguf.GGMLQuantizationType.Q4_1) for i, w in enumerate(weights)]
        for level in gguf_levels:
            lib = cpu_kernels.load_isa(level)
            print(f"gguf layers at {level}: int8 route {lib.forkless_quant_i8_route().decode()}", flush=True)
            for act in ("f32", "i8"):
                packed[f"gguf-{act}@{level}"] = [
                    GGUFLinear("Q8_0" if i == len(weights) - 1 else "Q4_1", b, w.shape[1],
                               activations="int8" if act == "i8" else "float32", lib=lib)
                    for i, (b, w) in enumerate(zip(blocks, weights))]
                names.append(f"gguf-{act}@{level}")

    def one_pass(name: str, x: torch.Tensor, n: int) -> float:
        if name == "torch-bf16" or name in bf16_layers:
            x = x.bfloat16()  # outside the timed loop below only in cost: one small copy
        t0 = time.perf_counter()
        for i in range(n):
            w = weights[i]
            xi = x[:, : w.shape[1]]
            if name == "torch":
                F.linear(xi, w)
            elif name == "torch-bf16":
                F.linear(xi, weights_bf16[i])
            else:
                packed[name][i](xi)
        return time.perf_counter() - t0

    one_row: dict[str, float] = {}  # the 1-row pass, where --rows has it

    def measure(rows: int, n: int, per_row: bool) -> dict[str, float]:
        x = torch.randn(rows, INTER, generator=gen)
        flops = 2 * rows * sum(weights[i].numel() for i in range(n))
        best = {name: float("inf") for name in names}
        with torch.inference_mode():
            for name in names:  # warm-up
                one_pass(name, x, n)
            for r in range(args.repeat):
                order = names[r % len(names):] + names[: r % len(names)]
                for name in order:
                    best[name] = min(best[name], one_pass(name, x, n))
        if rows == 1:
            one_row.update(best)
        cells = " | ".join(f"{best[name] * 1e3:8.1f} ms {flops / best[name] / 1e9:6.1f} GF/s" for name in names)
        ratios = " | ".join(f"{best['torch'] / best[level]:.2f}x" for level in levels)
        if args.baseline:
            ratios += " | " + " | ".join(f"{best[f'{level}@{args.baseline}'] / best[level]:.2f}x" for level in levels)
        if len(bf16_layers) == 2:
            ratios += f" | {best['bf16-onednn'] / best['bf16-kernel']:.2f}x"
        for level in gguf_levels:
            ratios += f" | {best[f'gguf-f32@{level}'] / best[f'gguf-i8@{level}']:.2f}x"
        if per_row:
            ratios += " | " + " | ".join(f"{best[name] / one_row[name]:.2f}" for name in names)
        print(f"| {rows:5d} | {cells} | {ratios} |", flush=True)
        return best

    def header(per_row: bool) -> str:
        extra = ""
        if args.baseline:
            extra += " | " + " | ".join(f"{level}@{args.baseline} / {level}" for level in levels)
        if len(bf16_layers) == 2:
            extra += " | bf16-onednn / bf16-kernel"
        for level in gguf_levels:
            extra += f" | gguf-f32@{level} / gguf-i8@{level}"
        if per_row:
            extra += " | " + " | ".join(f"{name} /1 row" for name in names)
        return f"| rows | {' | '.join(names)} | torch / " + " | torch / ".join(levels) + extra + " |"

    per_row = 1 in args.rows
    print(f"\nAll {LAYERS} layers + LM head, best of {args.repeat}:")
    print(header(per_row))
    for rows in sorted(args.rows, key=lambda rows: rows != 1):  # 1 row first: the others are put against it
        measure(rows, len(weights), per_row)
    if args.prefill_rows:
        print(f"\nPrefill: {args.prefill_layers} layers, no head, best of {args.repeat}:")
        print(header(False))
        measure(args.prefill_rows, 4 * args.prefill_layers, False)
    tmp.cleanup()


if __name__ == "__main__":
    main()
