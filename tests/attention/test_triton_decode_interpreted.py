"""The Triton decode kernel on the CPU, under Triton's interpreter (``TRITON_INTERPRET=1``),
against the torch reference.

CI has no GPU (``tests/gpu/test_triton_attention.py`` runs these launches and more on one). A
decode step of three sequences with 5-70 tokens of context over scattered cache blocks,
plus a padding sequence with no query (as a CUDA-graph batch has), float32 (the
interpreter's 16-bit ``tl.dot`` is not exact; the GPU tests hold bf16 and fp8 caches):
whole contexts and contexts split 3 and 4 ways (the splits' buffers and merge), both grid
orders, one and two KV heads per program, and the sequences walked longest first.
"""

from __future__ import annotations

from tests.triton_interpreter import needs_triton, run_interpreted

_SCRIPT = """
import torch
from forkless.attention import AttentionMetadata, get_attention_backend
from forkless.attention.backends.triton_paged import DecodeLaunch

HQ, HKV, D, BS, NB = 4, 2, 32, 16, 32


def error(dtype, kv_dtype, launch, splits, scales):
    ref = get_attention_backend("torch")(HQ, HKV, D, D**-0.5)
    tri = get_attention_backend("triton")(HQ, HKV, D, D**-0.5)
    tri.decode_override, tri.decode_splits = launch, splits
    tri.k_scale, tri.v_scale = scales
    shape = ref.get_kv_cache_shape(NB, BS, HKV, D)
    cache_ref, cache_tri = torch.zeros(shape), torch.zeros(shape, dtype=kv_dtype)
    gen = torch.Generator().manual_seed(0)
    lens = {"a": 37, "b": 5, "c": 70}
    free = torch.randperm(NB, generator=gen).tolist()
    tables = {s: [free.pop() for _ in range(-(-(n + 1) // BS))] for s, n in lens.items()}

    def rounded(x, scale):  # what the cache holds, dequantized
        return (x.float() / scale).to(kv_dtype).float() * scale

    def put(slot, k, v, reference=True):
        cache_tri[0].view(-1, HKV, D)[slot] = (k.float() / scales[0]).to(kv_dtype)
        cache_tri[1].view(-1, HKV, D)[slot] = (v.float() / scales[1]).to(kv_dtype)
        if reference:
            cache_ref[0].view(-1, HKV, D)[slot] = rounded(k, scales[0])
            cache_ref[1].view(-1, HKV, D)[slot] = rounded(v, scales[1])

    for s, n in lens.items():
        for pos in range(n):
            put(tables[s][pos // BS] * BS + pos % BS, torch.randn(HKV, D, generator=gen),
                torch.randn(HKV, D, generator=gen))
    seqs = list(lens)
    slots = [tables[s][lens[s] // BS] * BS + lens[s] % BS for s in seqs]
    starts = list(range(len(seqs) + 1)) + [len(seqs)]  # the last sequence: padding, no query
    seq_lens = [lens[s] + 1 for s in seqs] + [1]
    width = max(len(t) for t in tables.values())
    md = AttentionMetadata(
        slot_mapping=torch.tensor(slots + [-1]), query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([tables[s] + [0] * (width - len(tables[s])) for s in seqs] + [[0] * width],
                                  dtype=torch.int32),
        max_query_len=1, max_seq_len=max(seq_lens), block_size=BS,
        query_start_loc_cpu=torch.tensor(starts, dtype=torch.int32), seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32))
    q, k, v = (torch.randn(len(slots) + 1, h, D, generator=gen).to(dtype) for h in (HQ, HKV, HKV))
    for i, slot in enumerate(slots):
        put(slot, k[i], v[i], reference=False)  # the reference's forward stores its own
    out_ref = ref.forward(q.float(), rounded(k, scales[0]), rounded(v, scales[1]), cache_ref, md)
    out = tri.forward_stored(q, cache_tri, md)
    n = len(seqs)
    return (out[:n].float() - out_ref[:n].float()).abs().max().item()


cases = 0
for launch, splits in [(DecodeLaunch(block_n=16), None), (DecodeLaunch(block_n=16, heads_fast=True), 3),
                       (DecodeLaunch(kv_per_prog=2, block_n=32), 4),
                       (DecodeLaunch(block_n=16, heads_fast=True, longest_first=True), None),
                       (DecodeLaunch(block_n=16, longest_first=True), 3)]:
    e = error(torch.float32, torch.float32, launch, splits, (1.0, 1.0))
    assert e < 1e-5, (launch, splits, e)
    cases += 1
print("decode ok", cases)
"""


@needs_triton
def test_split_decode_under_the_interpreter() -> None:
    run_interpreted(_SCRIPT, "decode ok 5")
