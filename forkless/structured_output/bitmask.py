"""Applying a step's packed grammar bitmask to the logits (in the worker).

Invariants:
    * One batched operation per step, whatever the number of constrained rows: the
      packed rows are unpacked at once (numpy on the CPU, shifts on the device) and the
      disallowed logits of all rows are set to ``-inf`` together.
    * Row ``i`` of the bitmask belongs to logits row ``rows[i]``; other rows are untouched.
      Token ids past the bitmask's width are disallowed.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int, device: torch.device) -> torch.Tensor:
    """``[n, vocab_size]`` bool on ``device``: whether each token is *disallowed* (what
    ``masked_fill_`` takes, so that no negation pass is needed)."""
    n, words = bitmask.shape
    width = min(words * 32, vocab_size)
    if device.type == "cpu" and sys.byteorder == "little":
        # Word j's bit k is byte 4j + k // 8, bit k % 8: little-endian order, so
        # unpackbits(bitorder="little") lists token 32j + k at index 32j + k.
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :width]
        disallowed = torch.from_numpy(bits == 0)
    else:
        shifts = _SHIFTS.get(device)
        if shifts is None:
            shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
        packed = torch.from_numpy(bitmask if bitmask.flags.writeable else bitmask.copy())
        if device.type == "cuda":
            packed = packed.pin_memory()
        packed = packed.to(device, non_blocking=True)
        disallowed = ((packed.unsqueeze(-1) >> shifts) & 1).view(n, words * 32)[:, :width] == 0
    if width < vocab_size:
        disallowed = torch.nn.functional.pad(disallowed, (0, vocab_size - width), value=True)
    return disallowed


def apply_token_bitmask(logits: torch.Tensor, bitmask: np.ndarray, rows: list[int]) -> None:
    """Set to ``-inf``, in place, the logits of tokens the bitmask does not allow.

    Args:
        logits: ``[B, V]`` logits of the step's rows.
        bitmask: ``[len(rows), ceil(V' / 32)]`` int32 packed rows.
        rows: The logits row of each bitmask row.
    """
    if not rows:
        return
    disallowed = unpack_bitmask(bitmask, logits.shape[1], logits.device)
    if len(rows) == logits.shape[0] and rows == list(range(len(rows))):
        logits.masked_fill_(disallowed, float("-inf"))
        return
    index = torch.tensor(rows, dtype=torch.int64).to(logits.device, non_blocking=True)
    picked = logits.index_select(0, index)
    picked.masked_fill_(disallowed, float("-inf"))
    logits.index_copy_(0, index, picked)
