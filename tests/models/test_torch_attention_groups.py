"""Decode attention of the torch backend split into length groups (its CPU path)."""

from __future__ import annotations

import pytest
import torch

from forkless.attention import AttentionMetadata, get_attention_backend
from forkless.attention.backends import torch_sdpa
from forkless.attention.backends.torch_sdpa import _length_groups

HQ, HKV, D, BS, NUM_BLOCKS = 6, 2, 8, 4, 64


def _naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal GQA of the last ``len(q)`` positions of one sequence over all its keys."""
    k = k.repeat_interleave(HQ // HKV, dim=1)
    v = v.repeat_interleave(HQ // HKV, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * D**-0.5
    ctx = k.shape[0] - q.shape[0]
    allowed = torch.arange(k.shape[0])[None, :] <= (ctx + torch.arange(q.shape[0]))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(q.shape[0], -1)


def test_length_groups():
    lens = [5, 30, 7, 6, 29]
    assert _length_groups([0, 1, 2, 3, 4], lens, None) == [[0, 1, 2, 3, 4]]
    # Fits in one group: batch order is kept.
    assert _length_groups([0, 2, 3], lens, 21) == [[0, 2, 3]]
    # Sorted by length; each group's size times its longest length stays within the budget,
    # and a sequence longer than the budget is a group of its own.
    assert _length_groups([0, 1, 2, 3, 4], lens, 21) == [[0, 3, 2], [4], [1]]


@pytest.mark.parametrize("prefill", [False, True])
def test_grouped_decode_matches_naive(monkeypatch: pytest.MonkeyPatch, prefill: bool):
    # A budget of ~40 padded keys splits the decodes below into several groups.
    monkeypatch.setattr(torch_sdpa, "_CPU_DECODE_GROUP_BYTES", 40 * 2 * HKV * D * 4)
    gen = torch.Generator().manual_seed(0)
    backend = get_attention_backend("torch")(HQ, HKV, D, D**-0.5, layer_idx=0)
    cache = torch.zeros(get_attention_backend("torch").get_kv_cache_shape(NUM_BLOCKS, BS, HKV, D))
    blocks = torch.randperm(NUM_BLOCKS, generator=gen).tolist()

    # (context already cached, new tokens): decodes of assorted lengths, then maybe a prefill.
    seqs = [(11, 1), (3, 1), (17, 1), (4, 1), (9, 1), (22, 1), (1, 1)] + ([(0, 6)] if prefill else [])
    tables, slots, starts, lens, expected = [], [], [0], [], []
    num_new = sum(n for _, n in seqs)
    q, k, v = (torch.randn(num_new, h, D, generator=gen) for h in (HQ, HKV, HKV))
    row = 0
    for ctx, n in seqs:
        table = [blocks.pop() for _ in range(-(-(ctx + n) // BS))]
        tables.append(table)
        old_k, old_v = torch.randn(ctx, HKV, D, generator=gen), torch.randn(ctx, HKV, D, generator=gen)
        for pos in range(ctx):  # the cached context
            slot = table[pos // BS] * BS + pos % BS
            cache[0].view(-1, HKV, D)[slot] = old_k[pos]
            cache[1].view(-1, HKV, D)[slot] = old_v[pos]
        slots += [table[pos // BS] * BS + pos % BS for pos in range(ctx, ctx + n)]
        full_k = torch.cat([old_k, k[row : row + n]])
        full_v = torch.cat([old_v, v[row : row + n]])
        expected.append(_naive(q[row : row + n], full_k, full_v))
        row += n
        starts.append(row)
        lens.append(ctx + n)
    width = max(len(t) for t in tables)
    md = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_query_len=max(n for _, n in seqs),
        max_seq_len=max(lens),
        block_size=BS,
    )
    out = backend.forward(q, k, v, cache, md)
    assert len(md.backend_state["torch"].decode) > 1  # the split actually happened
    torch.testing.assert_close(out, torch.cat(expected))
