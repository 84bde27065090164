"""Decode attention against the GPU's copy bandwidth, and where a decode step's GPU time goes.

A decode step's attention reads every running sequence's keys and values once, so its
floor is those bytes over the device's bandwidth. This measures the Triton backend's
decode forward (store of the new keys/values + paged attention + split merge, captured in
a CUDA graph as the engine runs it) on the Qwen3-0.6B attention shape (16 query heads,
8 KV heads, head dim 128, block size 16, the engine's default) at batch 16-512 with
context lengths uniform in 100-2048, random block tables, random data; and a 4 GiB
device copy in the same run. Bandwidth counts the KV bytes read plus q, out and the new
keys/values; the ratio is attention bandwidth over copy bandwidth.

    python benchmarks/attention_bw.py                  # the old and the default launch, bf16 and fp8 caches
    python benchmarks/attention_bw.py --sweep          # + every candidate decode launch
    python benchmarks/attention_bw.py --compare DIR    # + another version's kernels (DIR holds
                                                       #   its triton_kernels.py and triton_paged.py)
    python benchmarks/attention_bw.py --step-profile   # + GPU kernels of real decode steps, batch 512
    python benchmarks/attention_bw.py --sweep --sweep-filter heads-fast --block-size 64  # some candidates, other blocks
    python benchmarks/attention_bw.py --no-bandwidth --overlap  # can a layer's GEMMs hide behind attention?

``--step-profile`` runs ``LLM`` on a Qwen3-0.6B-shaped model with random weights: 512
prompts of 100-1024 tokens, steps until every prompt is prefilled, then profiles decode
steps only, and prints the kernels by GPU time per step, grouped into attention, GEMMs,
sampling and the rest.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

HQ, HKV, D, BS = 16, 8, 128, 16


def _load_other(folder: Path):
    """Another version's TritonAttentionBackend, importing its own kernels module."""
    spec = importlib.util.spec_from_file_location("other_triton_kernels", folder / "triton_kernels.py")
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    sys.modules["other_triton_kernels"] = kernels
    src = (folder / "triton_paged.py").read_text().replace(
        "forkless.attention.backends.triton_kernels", "other_triton_kernels")
    mod = type(sys)("other_triton_paged")
    exec(compile(src, str(folder / "triton_paged.py"), "exec"), mod.__dict__)
    return mod.TritonAttentionBackend


class Batch:
    """One decode batch over a random paged cache."""

    def __init__(self, batch: int, kv_dtype, seed: int = 0) -> None:
        import torch

        from forkless.attention import AttentionMetadata

        dev = torch.device("cuda")
        g = torch.Generator().manual_seed(seed + batch)
        self.lens = torch.randint(100, 2049, (batch,), generator=g).tolist()
        nblocks = [-(-n // BS) for n in self.lens]
        total = sum(nblocks) + 1
        perm = torch.randperm(total, generator=g)[: sum(nblocks)].tolist()
        width = max(nblocks)
        tables, slots, at = [], [], 0
        for n, nb in zip(self.lens, nblocks):
            t = perm[at: at + nb]
            at += nb
            slots.append(t[(n - 1) // BS] * BS + (n - 1) % BS)
            tables.append(t + [0] * (width - nb))
        cache = torch.randn(2, total, BS, HKV, D, device=dev, dtype=torch.bfloat16)
        self.cache = cache.to(kv_dtype)
        self.q = torch.randn(batch, HQ, D, device=dev, dtype=torch.bfloat16)
        self.k = torch.randn(batch, HKV, D, device=dev, dtype=torch.bfloat16)
        self.v = torch.randn(batch, HKV, D, device=dev, dtype=torch.bfloat16)
        self.md = AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=dev),
            query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(self.lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            max_query_len=1, max_seq_len=max(self.lens), block_size=BS,
            query_start_loc_cpu=torch.arange(batch + 1, dtype=torch.int32),
            seq_lens_cpu=torch.tensor(self.lens, dtype=torch.int32),
        )
        elt = self.cache.element_size()
        # KV read + q read + out written + new k/v read and stored.
        self.bytes = (sum(self.lens) * 2 * HKV * D * elt + 2 * batch * HQ * D * 2
                      + batch * 2 * HKV * D * (2 + elt))

    def reference(self):
        import torch

        from forkless.attention import get_attention_backend

        ref = get_attention_backend("torch")(HQ, HKV, D, D**-0.5)
        cache = self.cache.float()
        k = self.k.to(self.cache.dtype).float()
        v = self.v.to(self.cache.dtype).float()
        return ref.forward(self.q.float(), k, v, cache, self.md).to(torch.float32)

    def time(self, backend, calls: int = 10, repeats: int = 15) -> float:
        """Median seconds of one forward, from replays of a graph of ``calls`` forwards."""
        return graph_time(lambda: backend.forward(self.q, self.k, self.v, self.cache, self.md), calls, repeats)


def graph_time(fn, calls: int = 10, repeats: int = 15) -> float:
    """Median seconds of one ``fn()`` (CUDA work only), from ``repeats`` replays of a CUDA
    graph of ``calls`` of them, after two warm-up calls on a side stream."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for i in range(repeats + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        if i >= 2:
            times.append(a.elapsed_time(b) / 1e3 / calls)
    del graph
    return statistics.median(times)


def _candidates():
    """The decode launches ``--sweep`` times. A first sweep on the H200 (benchmarks/README.md)
    found more KV heads per program and 16-token tiles slower at every batch; this one
    crosses the best tiles with context splits, for both cache dtypes."""
    from forkless.attention.backends.triton_paged import DecodeLaunch as L

    out = [L(1, bn, 4, st, sp) for bn, st in ((64, 2), (64, 3), (128, 2), (128, 3)) for sp in (1, 2, 4, 8)]
    # Larger tiles halve the loop's per-iteration overhead per byte; with an fp8 cache a
    # 256-token tile moves what a 128-token bf16 tile does (bf16 may not fit: reported).
    # The heads of a sequence side by side in the grid (HEADS_FAST), with the split rule.
    out += [L(1, 64, 4, 2, None, heads_fast=True), L(1, 128, 4, 2, None, heads_fast=True),
            L(1, 64, 4, 3, None, heads_fast=True)]
    # The same with the sequences walked longest first (the default's tile, 128 tokens from
    # batch 128 on, and 64 below).
    out += [L(1, 64, 4, 2, None, heads_fast=True, longest_first=True),
            L(1, 128, 4, 2, None, heads_fast=True, longest_first=True)]
    return out + [L(1, 128, 8, 2, 1), L(1, 256, 8, 2, 1), L(1, 64, 4, 2, 1, fp8_via_fp16=True),
                  L(1, 128, 4, 2, 1, fp8_via_fp16=True), L(1, 64, 4, 2, 1, keys_first=True),
                  L(1, 128, 4, 2, 1, keys_first=True), L(1, 128, 4, 2, 1, fp8_via_fp16=True, keys_first=True)] + [
        # The scores as an fp8 dot (fp8 cache only), keys first (the fp8 default: 128, 4, 2, heads-fast).
        L(1, bn, w, st, None, heads_fast=hf, fp8_dot=True)
        for bn, w, st, hf in ((64, 4, 2, True), (64, 4, 3, False), (128, 4, 2, True), (128, 8, 2, True))]


def bandwidth(args: argparse.Namespace) -> None:
    import torch

    from forkless.attention.backends.triton_paged import DECODE_BASELINE, TritonAttentionBackend
    from forkless.bench.latency import copy_bandwidth

    copy_bw = copy_bandwidth("cuda")
    print(f"{torch.cuda.get_device_name()}: device copy {copy_bw / 1e12:.3f} TB/s (read + written, 4 GiB)")
    print(f"attention: Hq=16 Hkv=8 D=128 block {BS}, context uniform 100-2048, bf16 queries")
    backends = {}
    base = TritonAttentionBackend(HQ, HKV, D, D**-0.5)
    base.decode_override = DECODE_BASELINE
    backends["before (kv/prog 1, 64-token tiles)"] = base
    backends["tuned (default launch)"] = TritonAttentionBackend(HQ, HKV, D, D**-0.5)
    if args.compare:
        backends[f"kernels of {args.compare}"] = _load_other(Path(args.compare))(HQ, HKV, D, D**-0.5)
    if args.sweep:
        for c in _candidates():
            name = (f"kv/prog {c.kv_per_prog} tile {c.block_n} warps {c.num_warps} stages {c.num_stages} "
                    f"splits {c.splits or 'auto'}{' fp8->f16' if c.fp8_via_fp16 else ''}"
                    f"{' keys-first' if c.keys_first else ''}{' heads-fast' if c.heads_fast else ''}"
                    f"{' fp8-dot' if c.fp8_dot else ''}{' longest-first' if c.longest_first else ''}")
            if args.sweep_filter and args.sweep_filter not in name:
                continue
            b = TritonAttentionBackend(HQ, HKV, D, D**-0.5)
            b.decode_override = c
            backends[name] = b
    dtypes = [("bf16", torch.bfloat16)]
    if not args.no_fp8:
        dtypes.append(("fp8", torch.float8_e4m3fn))
    print(f"{'launch':70s} {'kv':>4s} {'batch':>5s} {'us':>8s} {'TB/s':>6s} {'/copy':>6s} {'rel err':>8s}")
    for kv_name, kv_dtype in dtypes:
        for batch in args.batch:
            bt = Batch(batch, kv_dtype)
            ref = bt.reference() if batch <= 256 else None
            for name, backend in backends.items():
                swept = name.startswith("kv/prog")
                if (kv_name == "fp8" and not (swept or name.startswith("tuned"))) or (
                        swept and batch not in args.sweep_batch) or (
                        kv_name == "bf16" and ("fp8->f16" in name or "fp8-dot" in name)):
                    continue  # (the fp8 route option changes nothing for a bf16 cache)
                try:
                    err = ""
                    if ref is not None:
                        out = backend.forward(bt.q, bt.k, bt.v, bt.cache, bt.md).float().view_as(ref)
                        err = f"{((out - ref).norm() / ref.norm()).item():.1e}"
                    sec = backend_time = bt.time(backend)
                except Exception as exc:  # a candidate that does not compile is reported, not fatal
                    print(f"{name:70s} {kv_name:>4s} {batch:5d} failed: {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                bw = bt.bytes / sec
                print(f"{name:70s} {kv_name:>4s} {batch:5d} {backend_time * 1e6:8.1f} {bw / 1e12:6.3f} "
                      f"{bw / copy_bw:6.3f} {err:>8s}", flush=True)
            del bt


_GROUPS = (
    ("attention (paged_attention, combine, store_kv)", ("paged_attention", "combine_splits", "store_kv")),
    ("GEMMs (cuBLAS / cutlass / nvjet)", ("gemm", "sm90_", "nvjet", "cutlass", "cublas", "xmma")),
    ("norm / rotary / activation (fused Triton)", ("rms", "norm", "rotary", "rope", "silu", "act_")),
    ("sampling, logits, argmax, softmax", ("argmax", "softmax", "sample", "topk", "sort", "reduce", "max")),
    ("copies, index, fill, elementwise", ("copy", "index", "fill", "elementwise", "gather", "scatter", "cat")),
)


def dev_time(e) -> float:
    """A profiler event's own device time in us (``self_cuda_time_total`` on older torch)."""
    return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)


def kernel_groups(events) -> dict[str, float]:
    """Device time in us of profiler events, summed by :data:`_GROUPS` (the first group
    whose pattern a kernel's name holds; ``other`` for none)."""
    groups = {g: 0.0 for g, _ in _GROUPS} | {"other": 0.0}
    for e in events:
        key = e.key.lower()
        group = next((g for g, pats in _GROUPS if any(p in key for p in pats)), "other")
        groups[group] += dev_time(e)
    return groups


def step_profile(args: argparse.Namespace) -> None:
    import random

    import torch
    from torch.profiler import ProfilerActivity, profile

    from forkless import LLM, SamplingParams
    from forkless.bench.shapes import write_model_folder

    batch = args.profile_batch
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model_folder(Path(tmp) / "qwen3-0.6b", "qwen3-0.6b", dtype="bfloat16")
        extra = {} if args.profile_kv_cache_dtype == "auto" else {"kv_cache_dtype": args.profile_kv_cache_dtype}
        llm = LLM(str(model), dtype="bfloat16", load_format="dummy", max_num_seqs=batch, max_model_len=2048,
                  enforce_eager=args.enforce_eager, **extra)
        engine = llm.llm_engine
        params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True, detokenize=False)
        for i in range(batch):
            n = rng.randint(100, 1024)
            engine.add_request(str(i), {"prompt_token_ids": [rng.randrange(1000, 100000) for _ in range(n)]},
                               params)
        started: set[str] = set()
        t0 = time.perf_counter()
        while len(started) < batch:
            for o in engine.step():
                if o.outputs and o.outputs[0].token_ids:
                    started.add(o.request_id)
        for _ in range(5):
            engine.step()
        torch.cuda.synchronize()
        print(f"prefill of {batch} prompts done after {time.perf_counter() - t0:.1f} s")
        steps = args.profile_steps
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                engine.step()
            torch.cuda.synchronize()
        llm.shutdown()

    events = [e for e in prof.key_averages() if dev_time(e) > 0]
    events.sort(key=dev_time, reverse=True)
    total = sum(dev_time(e) for e in events)
    print(f"decode steps at batch {batch} (kv cache {args.profile_kv_cache_dtype}, "
          f"{'eager' if args.enforce_eager else 'CUDA graphs'}): wall {wall * 1e3:.2f} ms/step, "
          f"GPU kernel time {total / steps / 1e3:.2f} ms/step")
    for g, t in kernel_groups(events).items():
        print(f"  {g:50s} {t / steps / 1e3:8.3f} ms/step {100 * t / max(total, 1e-9):5.1f} %")
    print(f"{'kernel':80s} {'ms/step':>8s} {'calls/step':>10s}")
    for e in events[: args.top]:
        print(f"{e.key[:80]:80s} {dev_time(e) / steps / 1e3:8.3f} {e.count / steps:10.1f}")


def overlap(args: argparse.Namespace) -> None:
    """Times decode attention and one Qwen3-0.6B layer's four GEMMs at the same batch, alone
    and forked onto two streams of one graph, under cuBLASLt's SM carveout (SMs the GEMMs
    leave free) and with the GEMM stream at high priority or not. ``hidden`` is the share
    of the GEMMs' own time that running beside attention saved: 1 is a perfect overlap, 0
    none (they only interleave), negative a loss."""
    import torch
    import torch.nn.functional as F

    from forkless.attention.backends.triton_paged import TritonAttentionBackend

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    backend = TritonAttentionBackend(HQ, HKV, D, D**-0.5)
    hidden, inter = 1024, 3072
    w_qkv, w_o = (torch.randn(o, i, device=dev, dtype=bf16) / 32 for o, i in ((4096, hidden), (hidden, 2048)))
    w_gu, w_down = (torch.randn(o, i, device=dev, dtype=bf16) / 32 for o, i in ((2 * inter, hidden), (hidden, inter)))
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, {sms} SMs: one layer's GEMMs (qkv, o, gate_up, down) beside decode "
          f"attention, contexts 100-2048")
    print(f"{'batch':>5s} {'blas':>8s} {'carveout':>8s} {'prio':>5s} {'attn us':>8s} {'gemm us':>8s} "
          f"{'both us':>8s} {'hidden':>7s}")
    for batch in args.batch:
        bt = Batch(batch, bf16)
        x = torch.randn(batch, hidden, device=dev, dtype=bf16)

        def gemms():
            qkv = F.linear(x, w_qkv)
            o = F.linear(qkv[:, :2048], w_o)
            gu = F.linear(o, w_gu)
            return F.linear(gu[:, :inter], w_down)

        def attn():
            return backend.forward(bt.q, bt.k, bt.v, bt.cache, bt.md)

        t_a = graph_time(attn)
        for lib in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(lib)
            for carve in ((0,) if lib == "cublas" else (0, 8, 16, 32, sms // 2)):
                torch._C._set_sm_carveout_experimental(carve or None)
                t_g = graph_time(gemms)
                for prio in (False, True):
                    side = torch.cuda.Stream(priority=-1 if prio else 0)

                    def both():
                        side.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(side):
                            gemms()
                        attn()
                        torch.cuda.current_stream().wait_stream(side)

                    t_b = graph_time(both)
                    print(f"{batch:5d} {lib:>8s} {carve:8d} {str(prio):>5s} {t_a * 1e6:8.1f} {t_g * 1e6:8.1f} "
                          f"{t_b * 1e6:8.1f} {(t_a + t_g - t_b) / t_g:7.2f}", flush=True)
        torch._C._set_sm_carveout_experimental(None)
        torch.backends.cuda.preferred_blas_library("cublas")
        del bt


def main() -> None:
    global BS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 64, 128, 256, 512])
    parser.add_argument("--sweep", action="store_true", help="also time every candidate decode launch")
    parser.add_argument("--sweep-batch", type=int, nargs="+", default=[16, 64, 256, 512],
                        help="batches the sweep times")
    parser.add_argument("--sweep-filter", default=None, help="sweep only the candidates whose label holds this")
    parser.add_argument("--block-size", type=int, default=BS, help="tokens per cache block (the engine's default: 16)")
    parser.add_argument("--compare", default=None, help="a folder with another version's kernels")
    parser.add_argument("--no-fp8", action="store_true", help="bf16 cache only")
    parser.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth table")
    parser.add_argument("--step-profile", action="store_true", help="profile real decode steps")
    parser.add_argument("--profile-batch", type=int, default=512)
    parser.add_argument("--profile-steps", type=int, default=8)
    parser.add_argument("--profile-kv-cache-dtype", default="auto")
    parser.add_argument("--enforce-eager", action="store_true", help="profile without CUDA graphs")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--overlap", action="store_true",
                        help="time a layer's GEMMs beside decode attention on two streams (SM carveout, priority)")
    args = parser.parse_args()
    BS = args.block_size
    import torch

    if not torch.cuda.is_available():
        sys.exit("attention_bw.py measures the Triton kernels: it needs a CUDA GPU (none is available)")
    if not args.no_bandwidth:
        bandwidth(args)
    if args.overlap:
        overlap(args)
    if args.step_profile:
        step_profile(args)


if __name__ == "__main__":
    main()
