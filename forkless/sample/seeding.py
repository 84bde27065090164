"""Per-request random generators for seeded sampling.

A seeded row's generator is re-seeded every step from ``(seed, number of tokens generated
so far)``. So the noise for a request's k-th token depends on nothing but its seed and k:
not on other rows, its row position, steps where its sample was discarded (a chunked
prefill), or a preemption that recomputes it.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def step_seed(seed: int, step: int) -> int:
    """A well-mixed 63-bit seed for token ``step`` of a request seeded with ``seed``.

    Args:
        seed: ``SamplingParams.seed`` (any int, negative included).
        step: Number of tokens the request has generated so far.

    Returns:
        A non-negative seed for ``torch.Generator.manual_seed``.
    """
    return _splitmix64(_splitmix64(seed & _MASK64) ^ step) >> 1


def make_generator(device: torch.device) -> torch.Generator:
    """A generator on ``device`` (seeded later, per step, with ``step_seed``)."""
    return torch.Generator(device=device)
