"""Applying a step's packed grammar bitmask to the logits (in the worker).

Invariants:
    * One batched operation per step, whatever the number of constrained rows: on CUDA
      one Triton kernel reads the packed rows and writes ``-inf`` where they disallow
      (:mod:`forkless.structured_output.bitmask_triton`); elsewhere the rows are unpacked
      at once (numpy on the CPU, shifts on other devices) and the disallowed logits of all
      rows are set to ``-inf`` together.
    * Row ``i`` of the bitmask belongs to logits row ``rows[i]``; other rows are untouched.
      Token ids past the bitmask's width are disallowed.
    * A step's bitmask (:class:`StepBitmask`) has ``1 + num_spec_tokens`` rows per
      constrained request: the sampled position takes its last row, the ``j``-th
      verified position its row ``j`` (``forkless.protocol.step.SchedulerOutput``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from forkless.triton_utils import triton_available
from forkless.utils.torch_utils import async_tensor_h2d

if TYPE_CHECKING:
    from forkless.protocol.step import SchedulerOutput, ScheduledRequest

_SHIFTS: dict[torch.device, torch.Tensor] = {}
# Per CUDA device: a pinned staging buffer, reused (pinning a fresh one every step costs
# milliseconds), and the event of the last copy out of it.
_STAGING: dict[torch.device, tuple[torch.Tensor, torch.cuda.Event | None]] = {}
# Per CUDA device: the stream the bitmask's copies run on.
_COPY_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _copy_beside(host: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.cuda.Event]:
    """Copy pinned ``host`` to ``device`` on a side stream, which the current stream waits for.

    On the current stream the copy would queue behind the step's forward pass, which is
    still running when the bitmask arrives; beside it, the ~5 MB of a 256-row bitmask over
    a 151,936-token vocabulary cross PCIe while the GPU computes (~0.1-0.2 ms a step).

    Returns:
        ``(the device tensor, the event of the copy's end)``.
    """
    stream = _COPY_STREAMS.get(device)
    if stream is None:
        stream = _COPY_STREAMS[device] = torch.cuda.Stream(device)
    current = torch.cuda.current_stream(device)
    with torch.cuda.stream(stream):
        packed = host.to(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    current.wait_event(event)
    packed.record_stream(current)  # its memory outlives the copy stream's use of it
    return packed, event


def _staged_to_cuda(bitmask: np.ndarray, device: torch.device) -> torch.Tensor:
    """``bitmask`` on ``device``, copied through the reused pinned buffer -- or straight
    from where it is when that is pinned already (the engine core filled it in the
    worker's memory: ``Worker.allocate_host_buffer``; ~1 ms a step less at 256 rows of a
    151,936-token vocabulary)."""
    if bitmask.flags.c_contiguous and bitmask.flags.writeable:
        tensor = torch.from_numpy(bitmask)
        if tensor.is_pinned():
            return _copy_beside(tensor, device)[0]
    size = bitmask.size
    staging, copied = _STAGING.get(device, (None, None))
    if staging is None or staging.numel() < size:
        staging, copied = torch.empty(size, dtype=torch.int32, pin_memory=True), None
    if copied is not None:
        copied.synchronize()  # the step before's copy has left the buffer
    view = staging[:size].view(bitmask.shape)
    view.numpy()[...] = bitmask
    packed, event = _copy_beside(view, device)
    _STAGING[device] = (staging, event)
    return packed


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
        if device.type == "cuda":
            packed = _staged_to_cuda(bitmask, device)
        else:
            packed = torch.from_numpy(bitmask if bitmask.flags.writeable else bitmask.copy()).to(device)
        disallowed = ((packed.unsqueeze(-1) >> shifts) & 1).view(n, words * 32)[:, :width] == 0
    if width < vocab_size:
        disallowed = torch.nn.functional.pad(disallowed, (0, vocab_size - width), value=True)
    return disallowed


def apply_token_bitmask(logits: torch.Tensor, bitmask: np.ndarray, rows: list[int] | None) -> None:
    """Set to ``-inf``, in place, the logits of tokens the bitmask does not allow.

    Args:
        logits: ``[B, V]`` logits of the step's rows.
        bitmask: ``[len(rows), ceil(V' / 32)]`` int32 packed rows.
        rows: The logits row of each bitmask row; ``None``: row ``i`` for bitmask row
            ``i``.
    """
    if rows is not None:
        if not rows:
            return
        if rows == list(range(len(rows))):
            rows = None  # the first rows, in order: no index to build or gather by
    if logits.is_cuda and logits.stride(1) == 1 and triton_available():
        from forkless.structured_output.bitmask_triton import apply_bitmask_cuda

        apply_bitmask_cuda(logits, _staged_to_cuda(bitmask, logits.device), rows)
        return
    disallowed = unpack_bitmask(bitmask, logits.shape[1], logits.device)
    if rows is None:
        logits[: disallowed.shape[0]].masked_fill_(disallowed, float("-inf"))
        return
    index = async_tensor_h2d(rows, torch.int64, logits.device, logits.is_cuda)
    picked = logits.index_select(0, index)
    picked.masked_fill_(disallowed, float("-inf"))
    logits.index_copy_(0, index, picked)


@dataclass
class StepBitmask:
    """A step's bitmask, its rows matched to the step's rows (see the invariants).

    Attributes:
        bitmask: Every row the engine core sent.
        first: Step row index -> its first bitmask row, for the constrained rows.
        num_spec: Step row index -> its draft count, for the constrained rows.
    """

    bitmask: np.ndarray
    first: dict[int, int]
    num_spec: dict[int, int]
    # Every step row is constrained, has no drafts, and has bitmask row i as row i (the
    # usual step of a batch of constrained requests): the dicts are not needed to apply it.
    in_order: bool = False

    @classmethod
    def from_plan(cls, scheduler_output: SchedulerOutput, rows: list[ScheduledRequest]) -> StepBitmask:
        assert scheduler_output.grammar_bitmask is not None
        ids = scheduler_output.structured_output_request_ids
        bitmask = np.frombuffer(scheduler_output.grammar_bitmask, dtype=np.int32)
        if len(ids) == len(rows) and [s.request_id for s in rows if not s.num_spec_tokens] == ids:
            # No mapping to build, row by row (~0.1 ms a step at 256 rows).
            n = len(ids)
            return cls(bitmask.reshape(n, -1), dict(zip(range(n), range(n))), dict.fromkeys(range(n), 0), True)
        spec = {s.request_id: s.num_spec_tokens for s in scheduler_output.scheduled_requests}
        bitmask = bitmask.reshape(sum(1 + spec[rid] for rid in ids), -1)
        row_of = {s.request_id: i for i, s in enumerate(rows)}
        first: dict[int, int] = {}
        num_spec: dict[int, int] = {}
        offset = 0
        for rid in ids:
            i = row_of.get(rid)  # None: a failed LoRA load dropped its row
            if i is not None:
                first[i], num_spec[i] = offset, spec[rid]
            offset += 1 + spec[rid]
        return cls(bitmask, first, num_spec)

    def apply_sampled(self, logits: torch.Tensor) -> None:
        """Mask the sampler's logits (one row per step row, at its last position)."""
        if self.in_order:
            apply_token_bitmask(logits, self.bitmask, None)
            return
        rows = list(self.first)
        picked = [self.first[i] + self.num_spec[i] for i in rows]
        if picked == list(range(len(picked))):
            # No drafts and no dropped row: the bitmask as it came (a gather would copy
            # megabytes a step).
            apply_token_bitmask(logits, self.bitmask[: len(picked)], rows)
        else:
            apply_token_bitmask(logits, self.bitmask[picked], rows)

    def apply_verified(self, logits: torch.Tensor, row_indices: list[int]) -> None:
        """Mask verification logits ``[len(row_indices), k + 1, V]`` (position ``j`` of a
        row verifying ``m`` drafts: its row ``j``, for ``j <= m``)."""
        width = logits.shape[1]
        flat: list[int] = []
        picked: list[int] = []
        for n, i in enumerate(row_indices):
            if i in self.first:
                m = self.num_spec[i]
                flat.extend(range(n * width, n * width + m + 1))
                picked.extend(range(self.first[i], self.first[i] + m + 1))
        if flat:
            apply_token_bitmask(logits.view(-1, logits.shape[-1]), self.bitmask[picked], flat)
