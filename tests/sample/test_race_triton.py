"""The one-pass race (``race_triton``, the CUDA sampler's path for rows that need only a
temperature) draws from ``softmax(logits / T)`` and takes greedy rows' argmax, on the CPU
under Triton's interpreter; ``tests/sample/test_cuda.py`` runs it on a GPU through the
sampler."""

from __future__ import annotations

import pytest

from tests.triton_interpreter import needs_triton, run_interpreted

_SCRIPT = """
import math
import torch
from forkless.sample.race_triton import race_rows

def frequencies(tokens, ids):
    return [sum(1 for t in tokens if t == i) / len(tokens) for i in ids]

# (Small blocks: the interpreter runs each program in Python.)
# Random rows: the frequencies are softmax(logits / T)'s, not softmax(logits)'s (5 sigma
# at 1,000 draws: 0.08).
base = torch.tensor([1.0, 0.0, 2.0, float("-inf"), 0.5, -1.0])
rows, temp = 1000, 0.6
tokens = race_rows(base.repeat(rows, 1), torch.full((rows,), temp), seed=1234, block=8).tolist()
want = torch.softmax(base / temp, dim=0).tolist()
got = frequencies(tokens, range(6))
assert got[3] == 0.0, got  # a -inf logit is never drawn
assert all(abs(g - w) < 0.08 for g, w in zip(got, want)), (got, want)
assert abs(got[2] - torch.softmax(base, dim=0)[2].item()) > 0.1, got  # the temperature applies
# One seed, one draw; another seed, another.
few = base.repeat(60, 1)
assert race_rows(few, torch.full((60,), temp), seed=1234, block=8).tolist() == tokens[:60]
assert race_rows(few, torch.full((60,), temp), seed=99, block=8).tolist() != tokens[:60]

# Rows longer than one chunk, bfloat16 as a model gives them: the winners of three chunks
# meet in the second launch.
v = 40
logits = torch.full((300, v), float("-inf"))
for token, p in ((5, 0.2), (20, 0.3), (39, 0.5)):
    logits[:, token] = math.log(p)
tokens = race_rows(logits.to(torch.bfloat16), torch.ones(300), seed=7, block=16).tolist()
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
from forkless.sample.race_triton import race_rows_top_p

rows = 800
tokens = race_rows_top_p(base.repeat(rows, 1), torch.full((rows,), 0.8), torch.full((rows,), 0.7), seed=5,
                         block=8).tolist()
got = frequencies(tokens, range(6))
assert got[1] == got[3] == got[4] == got[5] == 0.0 and abs(got[2] - 0.777) < 0.06, got
only = race_rows_top_p(base.repeat(50, 1), torch.full((50,), 0.8), torch.full((50,), 0.05), block=8)
assert only.tolist() == [2] * 50
# top_p 1 is the plain race (token 1 is drawn too); greedy rows take their argmax; rows
# longer than a block are read block by block.
tokens = race_rows_top_p(base.repeat(rows, 1), torch.full((rows,), temp), torch.ones(rows), seed=6, block=8).tolist()
got = frequencies(tokens, range(6))
assert all(abs(g - w) < 0.08 for g, w in zip(got, want)), (got, want)
# Whole blocks of -inf before the first finite logit (a grammar's mask): the same set.
masked = torch.full((rows, 24), float("-inf"))
masked[:, 18:] = base
tokens = race_rows_top_p(masked, torch.full((rows,), 0.8), torch.full((rows,), 0.7), seed=8, block=8).tolist()
got = frequencies(tokens, range(18, 24))
assert got[1] == got[3] == got[4] == got[5] == 0.0 and abs(got[2] - 0.777) < 0.06, got
wide = torch.randn(4, 40)
got = race_rows_top_p(wide, torch.zeros(4), torch.full((4,), 0.5), block=16).tolist()
assert got == wide.argmax(dim=-1).tolist()
print("race ok")
"""


@pytest.mark.slow  # ~1 min: the interpreter runs each of ~4,000 programs in Python
@needs_triton
def test_one_pass_race_under_the_interpreter() -> None:
    run_interpreted(_SCRIPT, "race ok")
