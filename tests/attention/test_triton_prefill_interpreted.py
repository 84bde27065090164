"""The Triton prefill launches on the CPU, under Triton's interpreter (``TRITON_INTERPRET=1``),
against the torch reference.

CI has no GPU (``tests/gpu/test_triton_attention.py`` runs the same launches in bf16 on one).
One step, float32: a 40-token prompt, a 25-token chunk over 30 cached tokens and a decode
row, over scattered cache blocks, with query tiles of 8, 32 and 64 tokens (rows of two
query heads per KV head) and key tiles of 16 and 32 tokens: the causal edge inside a tile,
tiles past a short sequence's end, and keys read across cache blocks; with and without the
unmasked loop over the keys before a tile's first query (``split_causal``).
"""

from __future__ import annotations

from tests.triton_interpreter import needs_triton, run_interpreted

_SCRIPT = """
import torch
from forkless.attention import AttentionMetadata, get_attention_backend
from forkless.attention.backends.triton_paged import PrefillLaunch

HQ, HKV, D, BS, NB = 4, 2, 32, 16, 32
gen = torch.Generator().manual_seed(0)
ref = get_attention_backend("torch")(HQ, HKV, D, D**-0.5)
tri = get_attention_backend("triton")(HQ, HKV, D, D**-0.5)
shape = ref.get_kv_cache_shape(NB, BS, HKV, D)
seqs = [(0, 40), (30, 25), (12, 1)]  # (cached tokens, new tokens)
free = torch.randperm(NB, generator=gen).tolist()
tables = [[free.pop() for _ in range(-(-(c + n) // BS))] for c, n in seqs]
cache_ref, cache_tri = torch.zeros(shape), torch.zeros(shape)
slots, starts = [], [0]
for (c, n), table in zip(seqs, tables):
    for pos in range(c + n):
        slot = table[pos // BS] * BS + pos % BS
        if pos < c:  # context: already in both caches
            cache_ref[:, slot // BS, slot % BS] = torch.randn(2, HKV, D, generator=gen)
            cache_tri[:, slot // BS, slot % BS] = cache_ref[:, slot // BS, slot % BS]
        else:
            slots.append(slot)
    starts.append(starts[-1] + n)
width = max(len(t) for t in tables)
lens = [c + n for c, n in seqs]
md = AttentionMetadata(
    slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor(starts, dtype=torch.int32),
    seq_lens=torch.tensor(lens, dtype=torch.int32),
    block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
    max_query_len=max(n for _, n in seqs), max_seq_len=max(lens), block_size=BS,
    query_start_loc_cpu=torch.tensor(starts, dtype=torch.int32), seq_lens_cpu=torch.tensor(lens, dtype=torch.int32))
q, k, v = (torch.randn(len(slots), h, D, generator=gen) for h in (HQ, HKV, HKV))
out_ref = ref.forward(q, k, v, cache_ref, md)
# The new keys/values stored as the fused store would (its kernel's masked loads do not run
# under the interpreter); the kernel under test reads them from the cache.
for i, slot in enumerate(slots):
    cache_tri[0, slot // BS, slot % BS], cache_tri[1, slot // BS, slot % BS] = k[i], v[i]
cases = 0
for launch in [PrefillLaunch(16, 16, 4, 3), PrefillLaunch(64, 32, 4, 3), PrefillLaunch(128, 16, 8, 2),
               PrefillLaunch(16, 16, 4, 3, True), PrefillLaunch(64, 32, 4, 3, True), PrefillLaunch(32, 16, 4, 2, True)]:
    tri.prefill_override = launch
    out = tri.forward_stored(q, cache_tri, md)
    err = (out - out_ref).abs().max().item()
    assert err < 1e-5, (launch, err)
    cases += 1
print("prefill ok", cases)
"""


@needs_triton
def test_prefill_launches_under_the_interpreter() -> None:
    run_interpreted(_SCRIPT, "prefill ok 6")
