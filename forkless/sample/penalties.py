"""Repetition, presence and frequency penalties (OpenAI / vLLM definitions)."""

from __future__ import annotations

import torch


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Per-row occurrence counts of each token.

    Args:
        token_ids: ``[B, L]`` int64, padded with ``vocab_size``.
        vocab_size: Number of real tokens.

    Returns:
        ``[B, vocab_size]`` int64 counts (padding not counted).
    """
    counts = torch.zeros(
        (token_ids.shape[0], vocab_size + 1), dtype=torch.long, device=token_ids.device
    )
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids))
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor | None,
    output_token_ids: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """Penalize tokens the request has already seen.

    Repetition penalty applies to tokens in the prompt or the output: positive logits are
    divided by it, negative ones multiplied (so it always makes them less likely).
    Presence subtracts once per generated token kind, frequency once per occurrence.

    Args:
        logits: ``[B, V]`` float32.
        prompt_token_ids: ``[B, P]`` padded with V, or ``None`` when no row uses a
            repetition penalty.
        output_token_ids: ``[B, O]`` padded with V.
        presence_penalties: ``[B]``.
        frequency_penalties: ``[B]``.
        repetition_penalties: ``[B]`` (1.0 = off).

    Returns:
        The penalized logits (a new tensor).
    """
    vocab = logits.shape[1]
    output_counts = token_counts(output_token_ids, vocab)
    output_mask = output_counts > 0
    if prompt_token_ids is not None:
        seen = output_mask | (token_counts(prompt_token_ids, vocab) > 0)
        penalty = torch.where(seen, repetition_penalties.unsqueeze(1), 1.0)
        logits = torch.where(logits > 0, logits / penalty, logits * penalty)
    logits = logits - frequency_penalties.unsqueeze(1) * output_counts
    return logits - presence_penalties.unsqueeze(1) * output_mask
