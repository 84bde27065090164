"""Prefill attention: the Triton backend's launches against PyTorch's flash attention.

Times the paged Triton backend's attention of a prefill step (keys and values already in
the cache, as ``forward_stored`` runs between the piecewise graphs) in TFLOP/s, with
Qwen3-0.6B's heads (16 query heads, 8 KV heads, head dim 128, bf16, block size 16), on
four steps: the offline throughput workload's prompts (100-1,024 tokens, 8,192 in all),
4 x 2,048 tokens, one 8,192-token prompt, and a 2,048-token chunk over 6,144 cached tokens.
The baseline, in the same run: ``torch.nn.functional.scaled_dot_product_attention``
(causal, lower-right aligned) over the same queries and contiguous keys/values, one
sequence at a time (PyTorch picks its kernel: flash attention on an H100/H200). Every
launch's output is checked against it (relative L2 error). FLOPs count the visible
(query, key) pairs: 4 x heads x head dim per pair.

    python benchmarks/prefill_attention.py            # the default launch
    python benchmarks/prefill_attention.py --sweep    # + candidate launches; prints the fastest

Needs a CUDA GPU and Triton.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_bw import graph_time  # noqa: E402  (benchmarks/attention_bw.py)

HQ, HKV, D, BS = 16, 8, 128, 16


def _steps() -> dict[str, list[tuple[int, int]]]:
    """(cached context, new tokens) per sequence, by step name."""
    rng = random.Random(0)
    work, total = [], 0
    while total < 8192:
        n = min(rng.randint(100, 1024), 8192 - total)
        work.append((0, n))
        total += n
    return {"workload 8192": work, "4 x 2048": [(0, 2048)] * 4, "1 x 8192": [(0, 8192)],
            "2048 on 6144": [(6144, 2048)]}


class Step:
    """One prefill step over a random paged cache that already holds every key/value."""

    def __init__(self, seqs: list[tuple[int, int]], seed: int = 0) -> None:
        import torch

        from forkless.attention import AttentionMetadata

        dev = torch.device("cuda")
        g = torch.Generator().manual_seed(seed)
        lens = [c + n for c, n in seqs]
        nblocks = [-(-n // BS) for n in lens]
        perm = torch.randperm(sum(nblocks) + 1, generator=g)[: sum(nblocks)].tolist()
        width, tables, at = max(nblocks), [], 0
        for nb in nblocks:
            tables.append(perm[at: at + nb] + [0] * (width - nb))
            at += nb
        self.cache = torch.randn(2, sum(nblocks) + 1, BS, HKV, D, generator=g).to(dev, torch.bfloat16)
        starts = [0]
        for _, n in seqs:
            starts.append(starts[-1] + n)
        self.q = torch.randn(starts[-1], HQ, D, generator=g).to(dev, torch.bfloat16)
        self.md = AttentionMetadata(
            slot_mapping=torch.zeros(starts[-1], dtype=torch.int64, device=dev),  # unused: stored already
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            max_query_len=max(n for _, n in seqs), max_seq_len=max(lens), block_size=BS,
            query_start_loc_cpu=torch.tensor(starts, dtype=torch.int32),
            seq_lens_cpu=torch.tensor(lens, dtype=torch.int32),
        )
        # Each sequence's queries [1, HQ, n, D] and keys/values [1, HQ, c + n, D] (GQA heads
        # repeated) for the baseline.
        self.dense = []
        for i, (c, n) in enumerate(seqs):
            slots = torch.tensor([tables[i][p // BS] * BS + p % BS for p in range(c + n)], device=dev)
            k, v = (self.cache[j].view(-1, HKV, D)[slots].repeat_interleave(HQ // HKV, 1).transpose(0, 1)[None]
                    for j in (0, 1))
            self.dense.append((self.q[starts[i]: starts[i + 1]].transpose(0, 1)[None], k.contiguous(), v.contiguous()))
        self.flops = sum(4 * HQ * D * (n * c + n * (n + 1) // 2) for c, n in seqs)

    def baseline(self):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention.bias import causal_lower_right

        outs = []
        for q, k, v in self.dense:
            mask = causal_lower_right(q.shape[2], k.shape[2])
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=D**-0.5)[0].transpose(0, 1))
        return torch.cat(outs).reshape(-1, HQ * D)


def _candidates():
    from forkless.attention.backends.triton_paged import PrefillLaunch as P

    tiles = [(64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2),
             (64, 128, 4, 2), (256, 64, 8, 2), (128, 32, 4, 3), (128, 32, 8, 4)]
    # Each tile as swept on an H100 (benchmarks/README.md), and with the unmasked loop over
    # the keys before a tile's first query (split_causal).
    return [P(*t) for t in tiles[1:]] + [P(*t, split_causal=True) for t in tiles]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time the candidate launches")
    args = parser.parse_args()

    import torch

    from forkless.attention import get_attention_backend

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    steps = {name: Step(seqs) for name, seqs in _steps().items()}
    backend = get_attention_backend("triton")(HQ, HKV, D, D**-0.5)
    default = backend.prefill_launch(torch.bfloat16)
    launches = [("default", default)]
    if args.sweep:
        launches += [("candidate", c) for c in _candidates()]
    print(f"{'launch':46s} " + " ".join(f"{name:>20s}" for name in steps) + f" {'sum ms':>8s}")
    refs = {name: st.baseline() for name, st in steps.items()}
    base = {name: graph_time(st.baseline, 5, 9) for name, st in steps.items()}
    print(f"{'torch SDPA (ms, TFLOP/s)':46s} " + " ".join(
        f"{base[n] * 1e3:8.3f} {st.flops / base[n] / 1e12:5.0f}      " for n, st in steps.items())
        + f" {sum(base.values()) * 1e3:8.3f}")
    best, seen = None, {}
    for label, launch in launches:
        backend.prefill_override = launch
        row, total, ok = [], 0.0, True
        for name, st in steps.items():
            try:
                out = backend.forward_stored(st.q, st.cache, st.md).float()
                err = ((out - refs[name].float()).norm() / refs[name].float().norm()).item()
                t = graph_time(lambda: backend.forward_stored(st.q, st.cache, st.md), 5, 9)
            except Exception as e:  # a launch over the GPU's shared memory: reported, not fatal
                row.append(f"{type(e).__name__:>20s}")
                ok = False
                continue
            ok = ok and err < 2e-2
            total += t
            row.append(f"{t * 1e3:8.3f} {st.flops / t / 1e12:5.0f} {err:5.0e}")
        key = tuple(launch)
        print(f"{label + ' ' + str(key):46s} " + " ".join(row) + (f" {total * 1e3:8.3f}" if ok else "  (failed)"))
        if ok and key not in seen:
            seen[key] = total
            if best is None or total < seen[best]:
                best = key
    base_total = seen[tuple(default)]
    print(f"fastest: PrefillLaunch{best}, {seen[best] * 1e3:.3f} ms = {base_total / seen[best]:.2f}x the default "
          f"launch, {sum(base.values()) / seen[best]:.2f}x torch SDPA's speed")


if __name__ == "__main__":
    main()
