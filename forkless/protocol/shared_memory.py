"""Named shared memory for a step's grammar bitmask: one process fills it, workers read it.

Invariants:
    * A :class:`BitmaskSegments` hands out views of its newest segment; a request larger
      than that segment makes a new one (at least twice the size) and unlinks the old
      one's name at once (nobody can map it any more); old segments are unmapped when the
      pool closes, or when their last view goes.
    * Whoever maps a segment by name (a worker process, the grammar process) holds it as
      a :class:`Segment`, whose unmapping waits for the last view of it.
    * A worker process is told to sample a deferred step by one message,
      :func:`sample_message`: from the executor (the engine core filled the bitmask) or
      straight from the grammar process that filled it (``Executor.deferred_sample_route``).
    * The other way, the output rank's worker sends the grammar processes a deferred
      step's sampled tokens, :func:`grammar_tokens_message`, where its plan says so
      (``SchedulerOutput.grammar_tokens_to``): once per such step, also when it failed.
"""

from __future__ import annotations

from multiprocessing.shared_memory import SharedMemory
from typing import Any, Callable

import msgspec

#: The kind of the message that has a worker process sample a deferred step.
SAMPLE = b"sample"
#: The kind of the message that brings a grammar process a deferred step's tokens.
GRAMMAR_TOKENS = b"tokens"
_encoder = msgspec.msgpack.Encoder()


def sample_message(seq: int, where: str | None, nbytes: int, parts: int = 1) -> list[bytes]:
    """The frames that have a worker sample its step ``seq``: with the first ``nbytes`` of
    the segment named ``where`` as the bitmask (``None``: no bitmask; ``""``: the bitmask
    follows as a third frame, which the sender appends). With ``parts`` > 1, several
    senders (grammar processes) each wrote their rows of the one bitmask: the worker
    samples once all ``parts`` messages of the step came, without the bitmask if any of
    them has ``where=None`` (a failed fill)."""
    return [SAMPLE, _encoder.encode([seq, where, nbytes, parts])]


def decode_sample(payload: bytes) -> tuple[int, str | None, int, int]:
    """``(seq, where, nbytes, parts)`` of a :func:`sample_message`'s second frame."""
    return msgspec.msgpack.decode(payload, type=tuple[int, str | None, int, int])


def grammar_tokens_message(fill_id: int, tokens: list[int] | None) -> list[bytes]:
    """The frames a worker sends a grammar process with the tokens of a step planned with
    ``SchedulerOutput.grammar_tokens_to`` (``fill_id``): one per row of its
    ``structured_output_request_ids``, -1 for a row that sampled nothing; ``None``: the step
    failed (nothing to advance)."""
    return [GRAMMAR_TOKENS, _encoder.encode([fill_id, tokens])]


def decode_grammar_tokens(payload: bytes) -> tuple[int, list[int] | None]:
    """``(fill_id, tokens)`` of a :func:`grammar_tokens_message`'s second frame."""
    return msgspec.msgpack.decode(payload, type=tuple[int, list[int] | None])


class Segment(SharedMemory):
    """Shared memory whose unmapping waits for the last view of it: ``close`` fails while
    a view is referenced (a step's plan, a numpy array over it), which is not an error."""

    def release(self) -> None:
        """Unmap it, unless a view of it is still referenced (then when that goes)."""
        try:
            self.close()
        except BufferError:
            return

    def __del__(self) -> None:
        try:
            self.release()
        except OSError:
            return


class BitmaskSegments:
    """The segments an executor fills bitmasks into, newest last.

    Args:
        on_new: Called with each new segment's buffer (a worker in this process pins it);
            returns a handle that ``on_drop`` gets back when the pool closes.
        on_drop: Undoes ``on_new`` for one handle.
    """

    def __init__(self, on_new: Callable[[memoryview], Any] | None = None,
                 on_drop: Callable[[Any], None] | None = None) -> None:
        self._segments: list[Segment] = []
        self._handles: list[Any] = []
        self._on_new = on_new
        self._on_drop = on_drop

    @property
    def newest(self) -> Segment | None:
        return self._segments[-1] if self._segments else None

    def view(self, nbytes: int) -> tuple[str, memoryview]:
        """The first ``nbytes`` of the newest segment (grown first if it is smaller), and
        its name."""
        segments = self._segments
        if not segments or segments[-1].size < nbytes:
            if segments:
                segments[-1].unlink()
            segment = Segment(create=True, size=max(nbytes, 2 * segments[-1].size if segments else 0))
            segments.append(segment)
            if self._on_new is not None:
                self._handles.append(self._on_new(segment.buf))
        return segments[-1].name, segments[-1].buf[:nbytes]

    def close(self) -> None:
        """Unlink the newest segment's name and unmap them all (idempotent)."""
        if self._on_drop is not None:
            for handle in self._handles:
                if handle is not None:
                    self._on_drop(handle)
        self._handles = []
        for i, segment in enumerate(self._segments):
            if i == len(self._segments) - 1:
                segment.unlink()  # (the others were unlinked when outgrown)
            segment.release()
        self._segments = []
