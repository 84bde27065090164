"""Exp(1) noise for sampling by an exponential race (``argmax(p / q)``, ``q ~ Exp(1)``).

The race draws a token exactly from ``p`` with one noise value per vocabulary entry, so the
noise is drawn for every sampled row of every step. On the CPU torch's
``Tensor.exponential_`` draws it one value at a time: ~7 ms for 8 rows of 49,152 on the 2-core
Xeon of benchmarks/README.md, 15 % of a sampled decode step of the default model. Drawn as
``-log1p(-u)`` from uniform ``u`` in float64 it takes ~2.4 ms there: the same distribution
(``1 - u`` is uniform on (0, 1], so ``-log(1 - u)`` is Exp(1)) at full precision (float32
``u`` would quantise the tail to 24 bits). Other devices keep ``exponential_``, one kernel.

Invariants:
    * The values are positive: a zero would make ``p / q`` infinite (or NaN where ``p`` is
      0, a token top-k or top-p removed), so they are clamped to the smallest normal
      float32 -- where Exp(1) itself puts a value below it with probability ~1e-38.
    * With a ``generator`` the values come from it alone (seeded requests).
"""

from __future__ import annotations

import torch

_TINY = torch.finfo(torch.float32).tiny


def exponential_(out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Fill ``out`` (float32) with Exp(1) values, in place; returns ``out``."""
    if out.device.type != "cpu":
        return out.exponential_(generator=generator)
    u = torch.empty(out.shape, dtype=torch.float64).uniform_(generator=generator)
    torch.log1p(u.neg_(), out=u).neg_()
    return out.copy_(u).clamp_min_(_TINY)


__all__ = ["exponential_"]
