"""A decode step's GEMMs by batch size: cuBLAS against Triton tiles, and each against its bound.

For one decoder layer's projections of a model shape (q/k/v, o, gate/up, down) and the LM
head, at each ``--batch``: the time of one product inside a CUDA graph that runs it over
``--layers`` weight copies one after the other, as a decode step does (so no copy stays in
L2), timed with CUDA events over ``--repeat`` replays. Two ways:

* ``cublas``: ``F.linear``, what the engine runs at these batches;
* ``triton``: the best of a grid of ``tl.dot`` tiles (rows, columns, K step, warps,
  stages) for that shape and batch.

``--silu`` adds gate/up with SiLU-and-mul in the Triton GEMM's epilogue (the gate and up
tiles of the same columns side by side, so each program writes the activation: one launch
a layer fewer and half the output written) against cuBLAS followed by the engine's
SiLU-and-mul kernel.

Each line gives the microseconds a product, TFLOP/s, the weights' read rate, and the time
over its own bound: the larger of its FLOPs at the best bf16 matmul measured in the same
run and its weight bytes at the same run's device-to-device copy bandwidth. The last lines
sum a step's GEMMs (``layers`` x the four projections + the head) both ways.

    python benchmarks/gemm_shapes.py [--shape qwen3-0.6b] [--batch 16 64 128 256 512] [--silu] [--json out.json]

Needs a CUDA GPU and Triton.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attention_bw import graph_time  # noqa: E402  (benchmarks/attention_bw.py)

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the script needs it
    triton = None


if triton is not None:

    @triton.jit
    def _gemm(x_ptr, w_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y, up_offset,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
              SILU: tl.constexpr):
        """``y = x @ w.T`` for ``x [M, K]``, ``w [N, K]``; with ``SILU``, ``y = silu(x @ g.T) *
        (x @ u.T)`` where ``u``'s rows start ``up_offset`` rows after ``g``'s (gate/up)."""
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(N, BN)
        # Column tiles in groups, so that programs running together share weight tiles in L2.
        per_group = GROUP * tiles_m
        group = pid // per_group
        first_n = group * GROUP
        size = min(tiles_n - first_n, GROUP)
        pid_n = first_n + (pid % per_group) % size
        pid_m = (pid % per_group) // size
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        x = x_ptr + rm[:, None] * stride_x + rk[None, :]
        w = w_ptr + rn[None, :] * stride_w + rk[:, None]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        if SILU:
            acc_up = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            left = K - k * BK
            a = tl.load(x, mask=(rm[:, None] < M) & (rk[None, :] < left), other=0.0)
            b = tl.load(w, mask=(rn[None, :] < N) & (rk[:, None] < left), other=0.0)
            acc += tl.dot(a, b)
            if SILU:
                bu = tl.load(w + up_offset * stride_w, mask=(rn[None, :] < N) & (rk[:, None] < left), other=0.0)
                acc_up += tl.dot(a, bu)
            x += BK
            w += BK
        if SILU:
            # The unfused path's roundings: each product to the model's dtype, then SiLU-and-mul.
            g = acc.to(y_ptr.dtype.element_ty).to(tl.float32)
            u = acc_up.to(y_ptr.dtype.element_ty).to(tl.float32)
            acc = g / (1.0 + tl.exp(-g)) * u
        y = y_ptr + rm[:, None] * stride_y + rn[None, :]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, tile: tuple[int, ...], silu: bool = False):
    """Launch ``_gemm`` with ``tile = (BM, BN, BK, warps, stages)``; ``silu``: ``w`` is
    gate/up stacked and ``out`` is ``[M, N/2]``."""
    bm, bn, bk, warps, stages = tile
    m, k = x.shape
    n = w.shape[0] // 2 if silu else w.shape[0]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _gemm[grid](x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0), n,
                BM=bm, BN=bn, BK=bk, GROUP=8, SILU=silu, num_warps=warps, num_stages=stages)


TILES = [
    (bm, bn, bk, warps, stages)
    for bm, bn, bk, warps, stages in itertools.product((64, 128), (64, 128, 256), (64, 128), (4, 8), (3, 4))
    # Shared memory: stages x (BM + BN) x BK x 2 bytes must fit an H100's 227 KB.
    if stages * (bm + bn) * bk * 2 <= 200_000 and not (bm == 128 and bn == 256 and warps == 4)
]


def _us(launch, copies: int, repeat: int) -> float:
    """Microseconds of one product: a graph of ``launch``'s ``copies`` products, replayed."""
    return graph_time(launch, calls=1, repeats=repeat) * 1e6 / copies


def best_tile(run_tile, copies: int, repeat: int) -> tuple[float, tuple[int, ...]]:
    """``(microseconds, tile)`` of the fastest of :data:`TILES` for ``run_tile(tile)`` (a
    launch of ``copies`` products); a tile the device cannot run is skipped."""
    best = (float("inf"), TILES[0])
    for tile in TILES:
        try:
            t = _us(lambda: run_tile(tile), copies, repeat)
        except Exception as exc:  # shared memory the device does not have
            print(f"  tile {tile} skipped: {type(exc).__name__}")
            continue
        best = min(best, (t, tile), key=lambda p: p[0])
    return best


def projections(shape: str) -> tuple[int, dict[str, tuple[int, int]]]:
    """``(layers, {name: (out_features, in_features)})`` of a ``forkless.bench.shapes`` shape."""
    from forkless.bench.shapes import SHAPES

    cfg = SHAPES[shape]
    hidden, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    inter = cfg["intermediate_size"]
    return cfg["num_hidden_layers"], {
        "qkv": ((heads + 2 * kv_heads) * head_dim, hidden),
        "o": (hidden, heads * head_dim),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
        "lm_head": (cfg["vocab_size"], hidden),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 64, 128, 256, 384, 512])
    parser.add_argument("--layers", type=int, default=None, help="weight copies a graph walks (default: the shape's layers)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--only", nargs="*", default=None, help="projections to time (default: all)")
    parser.add_argument("--silu", action="store_true", help="also gate/up with SiLU-and-mul in the epilogue")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available() or triton is None:
        print("needs a CUDA GPU and Triton", file=sys.stderr)
        return 2
    from forkless.bench.floor import measured_matmul_flops
    from forkless.bench.latency import copy_bandwidth
    from forkless.ops.fused_triton import silu_and_mul

    torch.manual_seed(0)
    num_layers, projs = projections(args.shape)
    layers = args.layers or num_layers
    peak = measured_matmul_flops("cuda", "bfloat16", n=8192)
    bw = copy_bandwidth("cuda")
    print(f"{torch.cuda.get_device_name()}: best bf16 matmul {peak / 1e12:.0f} TFLOP/s, copy {bw / 1e12:.2f} TB/s; "
          f"{args.shape}, {layers} weight copies a graph, {len(TILES)} Triton tiles")
    names = args.only or list(projs)
    results: list[dict] = []
    step = {m: {"cublas": 0.0, "triton": 0.0} for m in args.batch}
    dt = torch.bfloat16
    for name in names:
        n, k = projs[name]
        copies = 1 if name == "lm_head" else layers
        weights = [torch.randn(n, k, device="cuda", dtype=dt) * k**-0.5 for _ in range(copies)]
        for m in args.batch:
            x = torch.randn(m, k, device="cuda", dtype=dt)
            outs = [torch.empty(m, n, device="cuda", dtype=dt) for _ in range(copies)]

            def cublas():
                for w, y in zip(weights, outs):
                    torch.matmul(x, w.t(), out=y)

            def tri(tile):
                for w, y in zip(weights, outs):
                    triton_gemm(x, w, y, tile)

            row = {"proj": name, "batch": m, "n": n, "k": k, "cublas_us": _us(cublas, copies, args.repeat)}
            best = best_tile(tri, copies, args.repeat)
            ref = F.linear(x, weights[0])
            triton_gemm(x, weights[0], outs[0], best[1])
            row["triton_err"] = (outs[0].float() - ref.float()).abs().max().item()
            row["triton_us"], row["triton_tile"] = best[0], list(best[1])
            flops, nbytes = 2 * m * n * k, n * k * 2
            row["bound_us"] = max(flops / peak, nbytes / bw) * 1e6
            results.append(row)
            scale = 1 if name == "lm_head" else num_layers
            for way in ("cublas", "triton"):
                step[m][way] += row[f"{way}_us"] * scale
            print(f"{name:>8} M={m:<4} N={n:<6} K={k:<5} cuBLAS {row['cublas_us']:7.2f} us "
                  f"({flops / row['cublas_us'] / 1e6:5.0f} TFLOP/s, {nbytes / row['cublas_us'] / 1e6:5.2f} TB/s, "
                  f"{row['cublas_us'] / row['bound_us']:.2f}x bound) | Triton {row['triton_us']:7.2f} us "
                  f"({row['cublas_us'] / row['triton_us']:.2f}x as fast, tile {best[1]}, err {row['triton_err']:.2g})",
                  flush=True)
    if args.silu:
        n, k = projs["gate_up"]
        weights = [torch.randn(n, k, device="cuda", dtype=dt) * k**-0.5 for _ in range(layers)]
        for m in args.batch:
            x = torch.randn(m, k, device="cuda", dtype=dt)
            mids = [torch.empty(m, n, device="cuda", dtype=dt) for _ in range(layers)]
            acts = [torch.empty(m, n // 2, device="cuda", dtype=dt) for _ in range(layers)]

            def unfused():
                for w, y, a in zip(weights, mids, acts):
                    torch.matmul(x, w.t(), out=y)
                    a.copy_(silu_and_mul(y))

            def fused(tile):
                for w, a in zip(weights, acts):
                    triton_gemm(x, w, a, tile, silu=True)

            t_unfused = _us(unfused, layers, args.repeat)
            best = best_tile(fused, layers, args.repeat)
            ref = silu_and_mul(F.linear(x, weights[0]))
            triton_gemm(x, weights[0], acts[0], best[1], silu=True)
            err = (acts[0].float() - ref.float()).abs().max().item()
            results.append({"proj": "gate_up+silu", "batch": m, "unfused_us": t_unfused, "fused_us": best[0],
                            "tile": list(best[1]), "err": err})
            print(f"gate_up+SiLU M={m:<4} cuBLAS + SiLU kernel {t_unfused:7.2f} us | fused Triton {best[0]:7.2f} us "
                  f"({t_unfused / best[0]:.2f}x as fast, tile {best[1]}, err {err:.2g})", flush=True)
    if not args.only:
        for m in args.batch:
            c, t = step[m]["cublas"], step[m]["triton"]
            print(f"a step's GEMMs at batch {m}: cuBLAS {c / 1e3:.3f} ms, best Triton tiles {t / 1e3:.3f} ms "
                  f"({c / t:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "peak_flops": peak,
                                               "copy_bandwidth": bw, "shape": args.shape, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
