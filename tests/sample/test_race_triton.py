"""The one-pass race (``race_triton``, the CUDA sampler's path for rows that need only a
temperature) draws from ``softmax(logits / T)`` and takes greedy rows' argmax, on the CPU
under Triton's interpreter; ``tests/sample/test_cuda.py`` runs it on a GPU through the
sampler."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.triton_interpreter import InterpretedRun, needs_triton

_SCRIPT = """
import math
import torch
from forkless.sample.race_triton import race_rows

def frequencies(tokens, ids):
    return [sum(1 for t in tokens if t == i) / len(tokens) for i in ids]

# (Small blocks: the interpreter runs each program in Python.)
# Random rows: the frequencies are softmax(logits / T)'s, not softmax(logits)'s (4 sigma
# at 400 draws: 0.1).
base = torch.tensor([1.0, 0.0, 2.0, float("-inf"), 0.5, -1.0])
rows, temp = 400, 0.6
tokens = race_rows(base.repeat(rows, 1), torch.full((rows,), temp), seed=1234, block=8).tolist()
want = torch.softmax(base / temp, dim=0).tolist()
got = frequencies(tokens, range(6))
assert got[3] == 0.0, got  # a -inf logit is never drawn
assert all(abs(g - w) < 0.1 for g, w in zip(got, want)), (got, want)
assert abs(got[2] - torch.softmax(base, dim=0)[2].item()) > 0.1, got  # the temperature applies
# One seed, one draw; another seed, another.
few = base.repeat(60, 1)
assert race_rows(few, torch.full((60,), temp), seed=1234, block=8).tolist() == tokens[:60]
assert race_rows(few, torch.full((60,), temp), seed=99, block=8).tolist() != tokens[:60]

# Rows longer than one chunk, bfloat16 as a model gives them: the winners of three chunks
# meet in the second launch.
v = 40
logits = torch.full((200, v), float("-inf"))
for token, p in ((5, 0.2), (20, 0.3), (39, 0.5)):
    logits[:, token] = math.log(p)
tokens = race_rows(logits.to(torch.bfloat16), torch.ones(200), seed=7, block=16).tolist()
got = frequencies(tokens, (5, 20, 39))
assert sum(got) == 1.0 and all(abs(g - w) < 0.12 for g, w in zip(got, (0.2, 0.3, 0.5))), got

# Greedy rows (T = 0) beside random ones: torch.argmax's index, first on ties, a NaN first.
mixed = torch.randn(6, v)
mixed[1, 2] = mixed[1, 30] = mixed[1].max() + 1.0  # a tie across chunks: the lower index
mixed[3, 25] = float("nan")
mixed[3, 33] = float("nan")
temps = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 0.0])
got = race_rows(mixed, temps, seed=3, block=16).tolist()
for r in (0, 1, 3, 5):
    assert got[r] == mixed[r].argmax().item(), (r, got[r])
assert got[1] == 2 and got[3] == 25
assert all(0 <= t < v for t in got)
# Without a seed, each call draws its own from torch's default generator (--seed fixes a run).
torch.manual_seed(0)
first = race_rows(few, torch.ones(60), block=8).tolist()
torch.manual_seed(0)
assert race_rows(few, torch.ones(60), block=8).tolist() == first

# Top-p without a sort: the tokens whose strictly more probable ones hold less than top_p
# of the mass, renormalised. softmax(base / 0.8) = [.185, .053, .647, 0, .099, .015]:
# top_p 0.7 keeps tokens 2 and 0 (0.777 / 0.223 after renormalising), 0.05 token 2 alone.
from forkless.sample.race_triton import race_rows_top_k_top_p

def race_rows_top_p(logits, temperature, top_p, **kw):
    return race_rows_top_k_top_p(logits, temperature, None, top_p, **kw)

rows = 300  # 3.7 sigma at 300 draws of p = .777: 0.09
tokens = race_rows_top_p(base.repeat(rows, 1), torch.full((rows,), 0.8), torch.full((rows,), 0.7), seed=5,
                         block=8).tolist()
got = frequencies(tokens, range(6))
assert got[1] == got[3] == got[4] == got[5] == 0.0 and abs(got[2] - 0.777) < 0.09, got
only = race_rows_top_p(base.repeat(50, 1), torch.full((50,), 0.8), torch.full((50,), 0.05), block=8)
assert only.tolist() == [2] * 50
# top_p 1 is the plain race (token 1 is drawn too); greedy rows take their argmax; rows
# longer than a block are read block by block.
tokens = race_rows_top_p(base.repeat(rows, 1), torch.full((rows,), temp), torch.ones(rows), seed=6, block=8).tolist()
got = frequencies(tokens, range(6))
assert all(abs(g - w) < 0.1 for g, w in zip(got, want)), (got, want)
# Whole blocks of -inf before the first finite logit (a grammar's mask): the same set.
masked = torch.full((rows, 24), float("-inf"))
masked[:, 18:] = base
tokens = race_rows_top_p(masked, torch.full((rows,), 0.8), torch.full((rows,), 0.7), seed=8, block=8).tolist()
got = frequencies(tokens, range(18, 24))
assert got[1] == got[3] == got[4] == got[5] == 0.0 and abs(got[2] - 0.777) < 0.09, got
wide = torch.randn(4, 40)
got = race_rows_top_p(wide, torch.zeros(4), torch.full((4,), 0.5), block=16).tolist()
assert got == wide.argmax(dim=-1).tolist()

print("race ok")
"""


_TOP_K_SCRIPT = """
import torch
from forkless.sample.race_triton import race_rows_top_k_top_p

def frequencies(tokens, ids):
    return [sum(1 for t in tokens if t == i) / len(tokens) for i in ids]

ROWS = 400  # 5 sigma at 400 draws: 0.1
# bf16, as a model gives logits (and exact here): two radix passes a row, not four.
base = torch.tensor([1.0, 0.0, 2.0, float("-inf"), 0.5, -1.0]).to(torch.bfloat16)
# Top-k: the k largest logits (ties with the k-th kept), found by a radix select over the
# logits' bits, renormalised; then top-p over what top-k kept, as the PyTorch path does.
# softmax(base / 0.8) = [.185, .053, .647, 0, .099, .015]: top_k 3 keeps 2, 0, 4
# (.696, .199, .106); with top_p 0.7 after it: 2 and 0 (.778, .222) -- the same set as
# top-p alone, but top_p 0.69 then keeps token 2 alone (top_k's renormalised .696 >= .69),
# where over the whole row (.647 < .69) it would keep 0 too.
# (Through the radix select: the candidate list's 2,048 entries a row are slow to interpret;
# that it takes the radix select's tokens is checked below.)
def race_top_k(logits, k, p=None, temp=0.8, candidates=0, **kw):
    rows = logits.shape[0]
    return race_rows_top_k_top_p(logits, torch.full((rows,), temp), torch.full((rows,), k),
                                 None if p is None else torch.full((rows,), p), candidates=candidates, **kw).tolist()

got = frequencies(race_top_k(base.repeat(ROWS, 1), 3, seed=9, block=8), range(6))
assert got[1] == got[3] == got[5] == 0.0, got
assert all(abs(g - w) < 0.1 for g, w in zip((got[2], got[0], got[4]), (0.696, 0.199, 0.106))), got
got = frequencies(race_top_k(base.repeat(ROWS, 1), 3, 0.7, seed=10, block=8), range(6))
assert got[1] == got[3] == got[4] == got[5] == 0.0 and abs(got[2] - 0.778) < 0.1, got
assert race_top_k(base.repeat(50, 1), 3, 0.69, block=8) == [2] * 50
assert race_top_k(base.repeat(50, 1), 1, block=8) == [2] * 50
# k at or above V, or 0, keeps every token; ties at the k-th value are all kept.
got = frequencies(race_top_k(base.repeat(200, 1), 6, seed=11, block=8), range(6))
assert got[1] > 0 and got[5] > 0, got
tied = torch.tensor([0.0, 1.0, 1.0, 1.0, -1.0, 1.0]).to(torch.bfloat16)
got = frequencies(race_top_k(tied.repeat(200, 1), 2, temp=1.0, seed=12, block=8), range(6))
assert got[0] == got[4] == 0.0 and all(abs(got[t] - 0.25) < 0.15 for t in (1, 2, 3, 5)), got
# Per-row k beside rows without one, greedy rows, -inf and NaN logits, negative logits
# and values on both sides of zero, a row wider than a block: each row's k largest.
wide = torch.randn(32, 40) * 3
wide[5, :30] = float("-inf")   # fewer finite logits than k: any of those
wide[6, 7] = float("nan")      # never drawn, not counted among the largest
wide[7] = -wide[7].abs()       # all negative
ks = torch.tensor([1, 2, 5, 40, 0, 12, 3, 4] * 4)
temps = torch.tensor([0.0, 0.7, 1.5, 1.0] * 8)
drawn = torch.stack([race_rows_top_k_top_p(wide, temps, ks, None, seed=s, block=16) for s in range(4)])
clean = torch.where(wide.isnan(), float("-inf"), wide)
for r in range(32):
    k = int(ks[r]) if 0 < ks[r] < 40 else 40
    kth = clean[r].sort(descending=True).values[k - 1]
    allowed = set(((clean[r] >= kth) & clean[r].isfinite()).nonzero().flatten().tolist())
    assert set(drawn[:, r].tolist()) <= allowed, (r, k, sorted(set(drawn[:, r].tolist())), sorted(allowed))
    if temps[r] == 0:
        assert set(drawn[:, r].tolist()) == {int(clean[r].argmax())}, r
# bf16 and fp16 logits as a model gives them (fewer radix passes: their keys' low bits are
# all alike), negative ones too, with ties.
for dtype in (torch.bfloat16, torch.float16):
    low = ((torch.rand(8, 40) - 0.8) * 6).to(dtype)
    low[0] = -low[0].abs()
    ks = torch.tensor([1, 2, 3, 5, 7, 11, 2, 1])
    drawn = torch.stack([race_rows_top_k_top_p(low, torch.ones(8), ks, None, seed=s, block=16) for s in range(6)])
    for r in range(8):
        kth = low[r].float().sort(descending=True).values[int(ks[r]) - 1]
        assert set(drawn[:, r].tolist()) <= set((low[r].float() >= kth).nonzero().flatten().tolist()), (dtype, r)
# A row with its own seed draws the same token whatever shares the call (the other rows'
# seeds, top-k and top-p, the row's place, whether the tensors are there at all);
# tests/sample/test_cuda.py checks the frequencies of many seeds' draws on a GPU.
seeds = torch.arange(30) * 7919 + 11
alone = [race_rows_top_k_top_p(base.unsqueeze(0), torch.ones(1), None, None, block=8,
                               row_seeds=seeds[i:i + 1]).item() for i in range(0, 30, 5)]
mixed_seeds = torch.stack([seeds, torch.full((30,), -1)], dim=1).flatten()  # unseeded rows between
both = race_rows_top_k_top_p(base.repeat(60, 1), torch.ones(60), torch.tensor([6, 2] * 30),
                             torch.tensor([1.0, 0.5] * 30), block=8, row_seeds=mixed_seeds).tolist()
assert [both[2 * i] for i in range(0, 30, 5)] == alone, (alone, both[:12])
assert len(set(both[0::2])) > 1  # the seeds draw different tokens
assert set(both[1::2]) <= {0, 2}  # the unseeded rows kept their own top-k
# The candidate list (logits at or above the k-th largest of slices' maxima, read instead
# of the row) takes the radix select's tokens from the same seed; rows it cannot list
# (k above the number of slices, more candidates than fit, ties, -inf, NaN) take the
# radix select. candidates=64 over 200 logits: 50 slices of 4; 8: 7 slices of 32.
wide = torch.randn(24, 200) * 2
wide[3, :150] = float("-inf")
wide[4, 7] = float("nan")
wide[5] = wide[5].round()
ks = torch.tensor([1, 2, 3, 5, 8, 13, 20, 40, 100, 199, 0, 7] * 2)
ps = torch.tensor([1.0, 0.9, 0.5, 0.95] * 6)
temps = torch.tensor([0.7, 1.0, 0.0, 1.3] * 6)
for dtype, cands in ((torch.float32, 64), (torch.bfloat16, 8)):
    x = wide.to(dtype)
    radix = race_rows_top_k_top_p(x, temps, ks, ps, seed=21, block=32, candidates=0)
    listed = race_rows_top_k_top_p(x, temps, ks, ps, seed=21, block=32, candidates=cands)
    assert listed.tolist() == radix.tolist(), (dtype, listed, radix)
# Fewer finite logits than k (a grammar's mask under top_k=20): the finite ones race, on
# both paths and in every dtype (bf16's radix threshold of -inf was a NaN: token V-1).
few = torch.full((4, 64), float("-inf"))
few[:, 5], few[:, 9], few[:, 40] = 1.0, 0.5, -2.0
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for cands in (0, 2048):
        drawn = race_rows_top_k_top_p(few.to(dtype), torch.ones(4), torch.full((4,), 20), None, seed=3, block=16,
                                      candidates=cands)
        assert set(drawn.tolist()) <= {5, 9, 40}, (dtype, cands, drawn)
print("top-k ok")
"""

_MIN_P_SCRIPT = """
import torch
from forkless.sample.race_triton import race_rows_top_k_top_p

def frequencies(tokens, ids):
    return [sum(1 for t in tokens if t == i) / len(tokens) for i in ids]

ROWS = 400  # 5 sigma at 400 draws: 0.1
base = torch.tensor([1.0, 0.0, 2.0, float("-inf"), 0.5, -1.0]).to(torch.bfloat16)
def race(logits, min_p, k=None, p=None, temp=0.8, **kw):
    rows = logits.shape[0]
    full = lambda v: None if v is None else torch.full((rows,), v)
    return race_rows_top_k_top_p(logits, torch.full((rows,), temp), full(k), full(p),
                                 min_p=torch.full((rows,), float(min_p)), **kw).tolist()

# softmax(base / 0.8) = [.185, .053, .647, 0, .099, .015]. min_p 0.2 (below .129) keeps 2
# and 0, renormalised (.778, .222); min_p is relative to the tempered distribution: at
# T = 2 ([.227, .138, .374, 0, .177, .084]; below .075) it keeps every finite logit.
got = frequencies(race(base.repeat(ROWS, 1), 0.2, seed=5, block=8), range(6))
assert got[1] == got[3] == got[4] == got[5] == 0.0 and abs(got[2] - 0.778) < 0.1, got
got = frequencies(race(base.repeat(ROWS, 1), 0.2, temp=2.0, seed=6, block=8), range(6))
assert got[3] == 0.0 and got[5] > 0.0 and abs(got[2] - 0.374) < 0.1, got
# min_p 0.1 (below .065) keeps 2, 0 and 4; then top-k 2 keeps 2 and 0; then top-p 0.69 over
# what min_p kept (.696, .199, .106) keeps 2 alone.
got = frequencies(race(base.repeat(ROWS, 1), 0.1, seed=7, block=8), range(6))
assert got[1] == got[3] == got[5] == 0.0 and all(
    abs(g - w) < 0.1 for g, w in zip((got[2], got[0], got[4]), (0.696, 0.199, 0.106))), got
assert set(race(base.repeat(60, 1), 0.1, k=2, seed=8, block=8, candidates=0)) == {0, 2}
assert race(base.repeat(50, 1), 0.1, p=0.69, block=8) == [2] * 50
assert race(base.repeat(50, 1), 1.0, block=8) == [2] * 50  # only the most likely
# Per-row min_p (0: off) beside greedy rows, against the sampler's PyTorch set (the built-in
# processor's rule on the tempered logits), with and without top-k, listed or not.
wide = torch.randn(16, 120) * 3
wide[5, :110] = float("-inf")
wide[6, 7] = float("nan")
min_p = torch.tensor([0.0, 0.05, 0.3, 0.9] * 4)
temps = torch.tensor([0.0, 0.7, 1.5, 1.0, 0.5, 2.0, 1.0, 0.9] * 2)
ks = torch.tensor([0, 5, 50, 3] * 4)
for dtype in (torch.float32, torch.bfloat16):
    x = wide.to(dtype)
    clean = torch.where(x.float().isnan(), float("-inf"), x.float())
    tempered = clean / torch.where(temps > 0, temps, 1.0).unsqueeze(1)
    keep = tempered >= tempered.amax(dim=1, keepdim=True) + torch.log(min_p).unsqueeze(1)
    for top_k in (None, ks):
        drawn = torch.stack([race_rows_top_k_top_p(x, temps, top_k, None, seed=s, block=32, min_p=min_p)
                             for s in range(2)])
        for r in range(16):
            allowed = keep[r] & clean[r].isfinite()
            if top_k is not None and 0 < top_k[r] < 120:
                allowed &= clean[r] >= clean[r].sort(descending=True).values[int(top_k[r]) - 1]
            got = set(drawn[:, r].tolist())
            assert got <= set(allowed.nonzero().flatten().tolist()), (dtype, r, got)
            if temps[r] == 0:
                assert got == {int(clean[r].argmax())}, r
    listed = race_rows_top_k_top_p(x, temps, ks, None, seed=9, block=32, candidates=32, min_p=min_p)
    radix = race_rows_top_k_top_p(x, temps, ks, None, seed=9, block=32, candidates=0, min_p=min_p)
    assert listed.tolist() == radix.tolist(), dtype
print("min_p ok")
"""


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, InterpretedRun]]:
    """The three scripts, started together: each is one Python thread, so together they use
    every core while the tests wait on them one by one (~170 s one after the other on 2 cores)."""
    started = {name: InterpretedRun(script) for name, script in
               (("race", _SCRIPT), ("top-k", _TOP_K_SCRIPT), ("min_p", _MIN_P_SCRIPT))}
    yield started
    for run in started.values():
        run.stop()


@pytest.mark.slow  # ~1 min: the interpreter runs each of ~4,000 programs in Python
@needs_triton
def test_one_pass_race_under_the_interpreter(runs: dict[str, InterpretedRun]) -> None:
    runs["race"].check("race ok")


@pytest.mark.slow  # ~1 min: four radix-select passes a row, each program run in Python
@needs_triton
def test_top_k_race_under_the_interpreter(runs: dict[str, InterpretedRun]) -> None:
    runs["top-k"].check("top-k ok")


@pytest.mark.slow  # the interpreter runs each row's passes in Python
@needs_triton
def test_min_p_race_under_the_interpreter(runs: dict[str, InterpretedRun]) -> None:
    runs["min_p"].check("min_p ok")
