"""The split point of piecewise CUDA graphs: where a capture stops around attention.

A prefill or mixed step cannot be captured whole (its attention launches grids sized by
the step's prompts), but everything between two attention calls only sees ``[T, ...]``
tensors. The worker (``forkless.worker.piecewise_graphs``) therefore captures those
stretches as graphs for a few padded token counts and runs attention eagerly between
their replays. While it captures, it installs an :class:`AttentionSplitter`; a backend
that declares ``supports_piecewise_graphs`` hands each ``forward_stored`` call to it
instead of attending (see ``TritonAttentionBackend.forward_stored``).

Invariants:
    * At most one splitter is installed, only while the worker captures (never while
      steps run), so the check a backend makes per call is one global read.
    * This module imports nothing heavy: the attention package stays importable
      without torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from forkless.attention.interface import AttentionBackend, AttentionMetadata


class AttentionSplitter(Protocol):
    """What a capture does at an attention call (implemented by the worker)."""

    def split(self, backend: AttentionBackend, q: torch.Tensor, kv_cache: torch.Tensor,
              attn_metadata: AttentionMetadata) -> torch.Tensor:
        """End the graph being captured before this attention call, note the call, start
        the next graph, and return the tensor the call's output will be written into
        (``[T, Hq * D]``, at an address fixed for the replays)."""


_splitter: AttentionSplitter | None = None


def active_splitter() -> AttentionSplitter | None:
    """The splitter of the capture in progress, or ``None`` (every step at run time)."""
    return _splitter


@contextmanager
def splitting(splitter: AttentionSplitter) -> Iterator[None]:
    """Install ``splitter`` for the duration of one capture."""
    global _splitter
    if _splitter is not None:
        raise RuntimeError("a piecewise capture is already in progress")
    _splitter = splitter
    try:
        yield
    finally:
        _splitter = None
