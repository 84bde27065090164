"""The exponential race's noise on the CPU: Exp(1), positive, reproducible per generator."""

from __future__ import annotations

import math

import torch

from forkless.sample.exponential import exponential_


def test_values_are_exp1_distributed_and_positive() -> None:
    torch.manual_seed(0)
    q = exponential_(torch.empty(1_000_000))
    assert q.dtype == torch.float32
    assert bool((q > 0).all()) and bool(torch.isfinite(q).all())
    assert abs(q.mean().item() - 1.0) < 0.005
    assert abs(q.var().item() - 1.0) < 0.01
    # The survival function of Exp(1) at a few points, into the tail.
    for x in (0.01, 0.5, 1.0, 3.0, 6.0):
        want = math.exp(-x)
        got = (q > x).float().mean().item()
        assert abs(got - want) < 4 * math.sqrt(want * (1 - want) / q.numel()) + 1e-6, (x, got, want)


def test_a_generator_gives_the_same_values_and_fills_a_view_in_place() -> None:
    a = torch.zeros(3, 1000)
    b = torch.zeros(3, 1000)
    exponential_(a[1], torch.Generator().manual_seed(7))
    exponential_(b[1], torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    assert bool((a[1] > 0).all()) and bool((a[0] == 0).all()) and bool((a[2] == 0).all())
    c = exponential_(torch.empty(1000), torch.Generator().manual_seed(8))
    assert not torch.equal(c, a[1])


def test_the_race_draws_tokens_in_proportion_to_their_probability() -> None:
    # argmax(p / q) with q ~ Exp(1) picks i with probability p_i; zero-probability tokens never.
    torch.manual_seed(1)
    p = torch.tensor([0.5, 0.3, 0.2, 0.0]).expand(200_000, 4).contiguous()
    picks = (p / exponential_(torch.empty_like(p))).argmax(dim=-1)
    counts = torch.bincount(picks, minlength=4).float() / picks.numel()
    assert counts[3].item() == 0.0
    assert torch.allclose(counts[:3], torch.tensor([0.5, 0.3, 0.2]), atol=0.005)
