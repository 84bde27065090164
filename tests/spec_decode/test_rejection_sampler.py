"""The rejection sampler keeps the target's output: greedy chains exactly, sampled
tokens in distribution (chi-square, fixed seed, significance 0.001, as vLLM's own
rejection-sampler tests check)."""

from __future__ import annotations

import torch

from forkless.spec_decode.rejection_sampler import PAD_TOKEN_ID, rejection_sample

V = 6
# chi-square critical value, 5 degrees of freedom (V - 1), significance 0.001
CHI2_CRIT_DF5 = 20.515


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_greedy_keeps_the_agreeing_prefix_then_the_targets_token() -> None:
    # Target argmax per position: 3, 1, 4, 5 (the last is the bonus position).
    logits = torch.full((3, 4, V), -5.0)
    for j, t in enumerate([3, 1, 4, 5]):
        logits[:, j, t] = 5.0
    drafts = torch.tensor([[3, 1, 4],    # all agree -> 3 drafts + bonus 5
                           [3, 2, 4],    # second disagrees -> 3, then the target's 1
                           [0, 1, 4]])   # first disagrees -> the target's 3 alone
    tokens, emitted = rejection_sample(drafts, torch.tensor([3, 3, 3]), logits, torch.zeros(3))
    assert emitted.tolist() == [4, 2, 1]
    assert tokens.tolist() == [[3, 1, 4, 5], [3, 1, PAD_TOKEN_ID, PAD_TOKEN_ID],
                               [3, PAD_TOKEN_ID, PAD_TOKEN_ID, PAD_TOKEN_ID]]


def test_padding_and_rows_without_drafts() -> None:
    logits = torch.full((2, 3, V), -5.0)
    logits[:, 0, 2] = 5.0
    logits[:, 1, 4] = 5.0
    # Row 0 drafted one token (2, agreed), its padding would also "agree" with nothing;
    # row 1 drafted nothing and decodes one token.
    drafts = torch.tensor([[2, PAD_TOKEN_ID], [PAD_TOKEN_ID, PAD_TOKEN_ID]])
    tokens, emitted = rejection_sample(drafts, torch.tensor([1, 0]), logits, torch.zeros(2))
    assert emitted.tolist() == [2, 1]
    assert tokens.tolist() == [[2, 4, PAD_TOKEN_ID], [2, PAD_TOKEN_ID, PAD_TOKEN_ID]]


def _target_and_draft() -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])
    q = torch.tensor([0.40, 0.05, 0.20, 0.05, 0.10, 0.20])
    return p, q


def test_sampled_tokens_follow_the_target_with_draft_probs() -> None:
    gen = torch.Generator().manual_seed(1234)
    n = 200_000
    p, q = _target_and_draft()
    drafts = torch.multinomial(q, n, replacement=True, generator=gen).view(n, 1)
    logits = torch.log(p).expand(n, 2, V).clone()
    tokens, emitted = rejection_sample(drafts, torch.ones(n, dtype=torch.long), logits, torch.ones(n),
                                       draft_probs=q.expand(n, 1, V), generator=gen)
    counts = torch.bincount(tokens[:, 0], minlength=V).float()
    assert _chi2(counts, p) < CHI2_CRIT_DF5
    # Acceptance rate is sum(min(p, q)) in expectation.
    accepted = float((emitted == 2).float().mean())
    assert abs(accepted - float(torch.minimum(p, q).sum())) < 0.01


def test_sampled_tokens_follow_the_target_with_one_hot_drafts() -> None:
    # A proposer without a distribution (ngram) always guesses token 0 here.
    gen = torch.Generator().manual_seed(99)
    n = 200_000
    p, _ = _target_and_draft()
    drafts = torch.zeros(n, 1, dtype=torch.long)
    logits = torch.log(p).expand(n, 2, V).clone()
    tokens, emitted = rejection_sample(drafts, torch.ones(n, dtype=torch.long), logits, torch.ones(n),
                                       generator=gen)
    counts = torch.bincount(tokens[:, 0], minlength=V).float()
    assert _chi2(counts, p) < CHI2_CRIT_DF5
    assert abs(float((emitted == 2).float().mean()) - float(p[0])) < 0.01


def test_the_second_token_follows_the_target_too() -> None:
    # Two positions with different target distributions; drafts from q at both.
    gen = torch.Generator().manual_seed(7)
    n = 200_000
    p1, q = _target_and_draft()
    p2 = torch.tensor([0.30, 0.10, 0.05, 0.05, 0.20, 0.30])
    drafts = torch.multinomial(q, 2 * n, replacement=True, generator=gen).view(n, 2)
    logits = torch.stack([torch.log(p1), torch.log(p2), torch.log(p1)]).expand(n, 3, V).clone()
    tokens, emitted = rejection_sample(drafts, torch.full((n,), 2), logits, torch.ones(n),
                                       draft_probs=q.expand(n, 2, V), generator=gen)
    second = tokens[emitted >= 2, 1]  # rows that got past the first position
    assert _chi2(torch.bincount(second, minlength=V).float(), p2) < CHI2_CRIT_DF5


def test_temperature_scales_the_target() -> None:
    gen = torch.Generator().manual_seed(5)
    n = 200_000
    p, _ = _target_and_draft()
    temperature = 0.5
    sharpened = torch.softmax(torch.log(p) / temperature, dim=0)
    drafts = torch.zeros(n, 1, dtype=torch.long)
    logits = torch.log(p).expand(n, 2, V).clone()
    tokens, _ = rejection_sample(drafts, torch.ones(n, dtype=torch.long), logits, torch.full((n,), temperature),
                                 generator=gen)
    assert _chi2(torch.bincount(tokens[:, 0], minlength=V).float(), sharpened) < CHI2_CRIT_DF5


def test_top_k_and_top_p_cut_the_target_as_the_sampler_does() -> None:
    gen = torch.Generator().manual_seed(11)
    n = 200_000
    p, q = _target_and_draft()
    # Top-3 of p is {1, 3, 4} (0.30, 0.25, 0.20); top-p 0.5 keeps {1, 3} (0.55 of the mass:
    # the smallest set from the top that reaches 0.5).
    cases = [(3, 1.0, [1, 3, 4]), (6, 0.5, [1, 3])]
    for k, top_p, kept in cases:
        want = torch.zeros(V)
        want[kept] = p[kept] / p[kept].sum()
        drafts = torch.multinomial(q, n, replacement=True, generator=gen).view(n, 1)
        logits = torch.log(p).expand(n, 2, V).clone()
        tokens, _ = rejection_sample(drafts, torch.ones(n, dtype=torch.long), logits, torch.ones(n),
                                     draft_probs=q.expand(n, 1, V), generator=gen,
                                     top_k=torch.full((n,), k), top_p=torch.full((n,), top_p))
        counts = torch.bincount(tokens[:, 0], minlength=V).float()
        assert counts[[i for i in range(V) if i not in kept]].sum() == 0, (k, top_p, counts)
        df = len(kept) - 1
        crit = {1: 10.828, 2: 13.816}[df]  # chi-square critical values at 0.001
        assert _chi2(counts[kept], want[kept]) < crit, (k, top_p, counts)
