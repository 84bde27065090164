"""Top-k and top-p (nucleus) filtering with a different k and p per row."""

from __future__ import annotations

import torch


def apply_top_k_top_p(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """Set the logits outside each row's top-k / top-p set to -inf.

    Ties at the k-th value are all kept; the most likely token always survives top-p.

    Args:
        logits: ``[B, V]`` float32, modified in place.
        k: ``[B]`` int64 (V = off), or ``None``.
        p: ``[B]`` float32 (1.0 = off), or ``None``.

    Returns:
        ``logits``.
    """
    if p is None:
        return logits if k is None else _top_k_only(logits, k)
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth = sorted_logits.gather(1, (logits.shape[1] - k).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
    cumulative = sorted_logits.softmax(dim=-1).cumsum_(dim=-1)
    drop = cumulative <= (1 - p).unsqueeze(1)
    drop[:, -1] = False
    sorted_logits.masked_fill_(drop, float("-inf"))
    return logits.scatter_(1, order, sorted_logits)


def _top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # topk over the largest k is far cheaper than a full vocabulary sort.
    off = k >= logits.shape[1]
    k = k.masked_fill(off, 1)
    max_k = int(k.max())
    kth = logits.topk(max_k, dim=1).values.gather(1, (k - 1).unsqueeze(1))
    kth.masked_fill_(off.unsqueeze(1), float("-inf"))
    return logits.masked_fill_(logits < kth, float("-inf"))
