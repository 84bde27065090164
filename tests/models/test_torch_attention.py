"""The torch reference backend, and the cpu backend built on it, against a naive attention."""

from __future__ import annotations

import pytest
import torch

from forkless.attention import AttentionMetadata, get_attention_backend

HQ, HKV, D, BS, NUM_BLOCKS = 4, 2, 8, 4, 32


def naive(q, k, v, scale):
    """Causal GQA where q are the last rows of the sequence whose keys are k/v."""
    k = k.repeat_interleave(HQ // HKV, dim=1)
    v = v.repeat_interleave(HQ // HKV, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    ctx = k.shape[0] - q.shape[0]
    allowed = torch.arange(k.shape[0])[None, :] <= (ctx + torch.arange(q.shape[0]))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(q.shape[0], -1)


class Driver:
    """Keeps per-sequence k/v history and block tables, and runs backend steps."""

    def __init__(self, with_cache: bool = True, backend: str = "torch"):
        backend_cls = get_attention_backend(backend)
        self.backend = backend_cls(HQ, HKV, D, D**-0.5, layer_idx=0)
        shape = backend_cls.get_kv_cache_shape(NUM_BLOCKS, BS, HKV, D)
        self.cache = torch.zeros(shape) if with_cache else None
        self.blocks = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(7)).tolist()
        self.tables: dict[str, list[int]] = {}
        self.history: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.gen = torch.Generator().manual_seed(0)

    def step(self, batch: list[tuple[str, int]], pad: int = 0):
        T = sum(n for _, n in batch) + pad
        q, k, v = (torch.randn(T, h, D, generator=self.gen) for h in (HQ, HKV, HKV))
        slots, starts, lens, expected, row = [], [0], [], [], 0
        for seq, n in batch:
            old_k, old_v = self.history.get(seq, (k[:0], v[:0]))
            ctx = old_k.shape[0]
            table = self.tables.setdefault(seq, [])
            for pos in range(ctx, ctx + n):
                if pos // BS >= len(table):
                    table.append(self.blocks.pop())
                slots.append(table[pos // BS] * BS + pos % BS)
            full_k = torch.cat([old_k, k[row : row + n]])
            full_v = torch.cat([old_v, v[row : row + n]])
            self.history[seq] = (full_k, full_v)
            expected.append(naive(q[row : row + n], full_k, full_v, D**-0.5))
            row += n
            starts.append(row)
            lens.append(ctx + n)
        slots += [-1] * pad
        width = max(len(self.tables[s]) for s, _ in batch)
        md = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32),
            block_tables=torch.tensor([self.tables[s] + [0] * (width - len(self.tables[s])) for s, _ in batch], dtype=torch.int32),
            max_query_len=max(n for _, n in batch),
            max_seq_len=max(lens),
            block_size=BS,
        )
        out = self.backend.forward(q, k, v, self.cache, md)
        assert out.shape == (T, HQ * D)
        return out[:row], torch.cat(expected)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_prefill_decode_chunked_and_padding(backend: str):
    drv = Driver(backend=backend)
    out, ref = drv.step([("a", 5), ("b", 9)])
    torch.testing.assert_close(out, ref)
    # a decodes, b continues a chunked prefill, c is fresh, d is a fresh single token,
    # and two padding rows trail the batch.
    out, ref = drv.step([("a", 1), ("b", 3), ("c", 4), ("d", 1)], pad=2)
    torch.testing.assert_close(out, ref)
    # Decodes of different lengths share one padded batch.
    for _ in range(3):
        out, ref = drv.step([("a", 1), ("b", 1), ("c", 1), ("d", 1)])
        torch.testing.assert_close(out, ref)
    # An all-decode step with padding rows after it (a CUDA-graph batch).
    out, ref = drv.step([("a", 1), ("b", 1)], pad=3)
    torch.testing.assert_close(out, ref)
    # Padding (slot -1) wrote nothing: exactly one slot per real token is non-zero.
    stored = drv.cache[0].reshape(-1, HKV * D).abs().sum(-1).gt(0).sum().item()
    assert stored == sum(k.shape[0] for k, _ in drv.history.values())


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_metadata_host_copies_are_used(backend: str):
    drv = Driver(backend=backend)
    drv.step([("a", 6)])
    backend = drv.backend
    q, k, v = torch.randn(1, HQ, D), torch.randn(1, HKV, D), torch.randn(1, HKV, D)
    table = drv.tables["a"]
    md = AttentionMetadata(
        slot_mapping=torch.tensor([table[1] * BS + 2]),
        # Device-side tensors deliberately wrong: the backend must plan from host copies.
        query_start_loc=torch.tensor([0, 99], dtype=torch.int32),
        seq_lens=torch.tensor([7], dtype=torch.int32),
        block_tables=torch.tensor([table], dtype=torch.int32),
        max_query_len=1,
        max_seq_len=7,
        block_size=BS,
        query_start_loc_cpu=torch.tensor([0, 1], dtype=torch.int32),
        seq_lens_cpu=torch.tensor([7], dtype=torch.int32),
    )
    out = backend.forward(q, k, v, drv.cache, md)
    old_k, old_v = drv.history["a"]
    ref = naive(q, torch.cat([old_k, k]), torch.cat([old_v, v]), D**-0.5)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_without_cache_only_fresh_prefill(backend: str):
    drv = Driver(with_cache=False, backend=backend)
    out, ref = drv.step([("a", 3), ("b", 5)])
    torch.testing.assert_close(out, ref)
    with pytest.raises(ValueError, match="KV cache"):
        drv.step([("a", 1)])
