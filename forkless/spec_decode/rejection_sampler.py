"""Verification of draft tokens: which of them the target model would have produced.

Speculative sampling (Leviathan et al. 2023, Chen et al. 2023). A request with k draft
tokens ``d_1..d_k`` is scored by the target at k+1 positions in one pass; position ``j``'s
distribution ``p_j`` is the target's next-token distribution after the drafts before it.

* Greedy requests (temperature 0) keep drafts while each equals ``argmax p_j``; the first
  that does not is replaced by that argmax, and when all are kept the argmax of
  ``p_{k+1}`` (the bonus token) follows. Exactly greedy decoding's tokens.
* Sampled requests (whose ``p_j`` is the tempered distribution, cut to its top-k and top-p
  set when the request asks, as the sampler cuts it) keep ``d_j`` with probability ``min(1, p_j(d_j) / q_j(d_j))``, ``q_j``
  the draft's distribution (a draft without one, such as ``ngram``'s, is one-hot:
  ``q_j(d_j) = 1``). At the first rejection the token is drawn from the residual
  ``max(p_j - q_j, 0)`` renormalised; when all are kept, from ``p_{k+1}``. Every emitted
  token is then distributed exactly as the target's own sample.

Invariants:
    * Batched on the device: the whole batch is verified with tensor operations, with no
      host synchronisation and no loop over requests or positions.
    * Every request emits between 1 and ``num_draft + 1`` tokens: the accepted drafts,
      then one token of the target's. A request without drafts (``num_draft`` 0) emits
      one token, sampled from ``p_1`` as without speculation.
    * Rows are padded to ``k`` drafts; padding is never accepted and never emitted.
"""

from __future__ import annotations

import torch

from forkless.sample.argmax import row_argmax
from forkless.sample.exponential import exponential_
from forkless.sample.top_k_top_p import apply_top_k_top_p

#: Marks the unused tail of a row of drafts or of emitted tokens.
PAD_TOKEN_ID = -1


def _exponential(shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    return exponential_(torch.empty(shape, device=device, dtype=torch.float32), generator)


def rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify a batch of drafts against the target's logits.

    Args:
        draft_token_ids: ``[B, K]`` int64 draft tokens, ``PAD_TOKEN_ID`` past each row's
            ``num_draft_tokens``.
        num_draft_tokens: ``[B]`` int64, each row's draft count (0..K).
        target_logits: ``[B, K + 1, V]``: the target's logits at each draft position and
            after the last (already through penalties and logits processors; not divided
            by the temperature).
        temperature: ``[B]`` float; 0 means greedy.
        draft_probs: ``[B, K, V]`` the draft's distributions, or ``None`` for one-hot
            drafts (a proposer that guesses without a distribution).
        generator: Random source for the sampled rows.
        top_k: ``[B]`` int64 (vocabulary size = off), or ``None``: the sampled rows'
            target is the tempered distribution cut to its top k, as the sampler cuts it.
        top_p: ``[B]`` float32 (1.0 = off), or ``None``: and then to its top-p nucleus.

    Returns:
        ``(tokens, num_emitted)``: ``[B, K + 1]`` int64 emitted tokens (``PAD_TOKEN_ID``
        after the first ``num_emitted`` of a row) and ``[B]`` int64 counts.
    """
    batch, k = draft_token_ids.shape
    device = target_logits.device
    positions = torch.arange(k + 1, device=device)
    valid = positions[:k].unsqueeze(0) < num_draft_tokens.unsqueeze(1)  # [B, K]
    drafts = torch.where(valid, draft_token_ids, torch.zeros_like(draft_token_ids))
    greedy = temperature <= 0
    logits = target_logits.float()
    target_argmax = row_argmax(logits)  # [B, K+1]
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    scaled = logits / scale.view(batch, 1, 1)
    if top_k is not None or top_p is not None:
        # The sampler's order: temperature, then top-k, then top-p, on every position.
        flat = scaled.view(batch * (k + 1), -1)
        apply_top_k_top_p(flat, None if top_k is None else top_k.repeat_interleave(k + 1),
                          None if top_p is None else top_p.float().repeat_interleave(k + 1))
    probs = torch.softmax(scaled, dim=-1)  # [B, K+1, V]

    # Which drafts are accepted.
    p_draft = probs[:, :k].gather(2, drafts.unsqueeze(2)).squeeze(2)  # [B, K]
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = draft_probs.float().gather(2, drafts.unsqueeze(2)).squeeze(2)
    uniform = torch.rand((batch, k), device=device, generator=generator)
    accept_sampled = uniform * q_draft < p_draft  # u < p/q, without dividing by a zero q
    accept_greedy = target_argmax[:, :k] == drafts
    accept = torch.where(greedy.unsqueeze(1), accept_greedy, accept_sampled) & valid
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)  # [B]

    # The target's own token at position num_accepted: from the residual after a
    # rejection, from p itself after all drafts were kept.
    rows = torch.arange(batch, device=device)
    p_last = probs[rows, num_accepted]  # [B, V]
    rejected = num_accepted < num_draft_tokens
    if k == 0:
        q_last = torch.zeros_like(p_last)  # nothing was drafted, so nothing was rejected
    elif draft_probs is None:
        # Only read where a draft was rejected, i.e. num_accepted < k.
        rejected_draft = drafts[rows, num_accepted.clamp(max=k - 1)]
        q_last = torch.nn.functional.one_hot(rejected_draft, p_last.shape[-1]).float()
    else:
        q_last = draft_probs.float()[rows, num_accepted.clamp(max=k - 1)]
    residual = (p_last - q_last).clamp(min=0)
    mass = residual.sum(dim=-1, keepdim=True)
    # A residual of no mass (p and q equal to rounding) leaves p itself.
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_last)
    dist = torch.where(rejected.unsqueeze(1), residual, p_last)
    sampled = row_argmax(dist / _exponential(tuple(dist.shape), device, generator))
    final = torch.where(greedy, target_argmax[rows, num_accepted], sampled)

    tokens = torch.full((batch, k + 1), PAD_TOKEN_ID, dtype=torch.long, device=device)
    keep = positions[:k].unsqueeze(0) < num_accepted.unsqueeze(1)
    tokens[:, :k] = torch.where(keep, drafts, tokens[:, :k])
    tokens[rows, num_accepted] = final
    return tokens, num_accepted + 1
