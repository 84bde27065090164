"""Accumulates one step's row changes into a ``BatchUpdate``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from forkless.logits_processors.interface import BatchUpdate, MoveDirectionality

if TYPE_CHECKING:
    from forkless.logits_processors.interface import AddedRequest, MovedRequest


class BatchUpdateBuilder:
    """Records removals, additions and moves in an order processors can replay.

    Processors apply ``removed``, then ``added``, then ``moved``. That replays the real
    sequence exactly when a step does its removals and additions before any move, which
    ``InputBatch`` enforces: a removal or addition after a move in the same step is an
    error rather than a silently misaligned processor.
    """

    def __init__(self) -> None:
        self._removed: list[int] = []
        self._added: list["AddedRequest"] = []
        self._moved: list["MovedRequest"] = []

    @property
    def changed(self) -> bool:
        return bool(self._removed or self._added or self._moved)

    def removed_append(self, index: int) -> None:
        self._check_no_moves("remove a request")
        # A request added and removed within the same step never reaches a processor.
        self._added = [a for a in self._added if a[0] != index]
        if index not in self._removed:
            self._removed.append(index)

    def discard_removed(self, index: int) -> None:
        """A new request reuses a freed row: its ``added`` entry replaces the old state."""
        if index in self._removed:
            self._removed.remove(index)

    def added_append(self, added: "AddedRequest") -> None:
        self._check_no_moves("add a request")
        self._added.append(added)

    def moved_append(self, src: int, dst: int, direction: MoveDirectionality) -> None:
        self._moved.append((src, dst, direction))

    def _check_no_moves(self, what: str) -> None:
        if self._moved:
            raise RuntimeError(
                f"cannot {what} after rows were moved (condense/swap) in the same step; "
                "call InputBatch.refresh() first"
            )

    def get_and_reset(self, batch_size: int) -> BatchUpdate | None:
        """The accumulated update (``None`` when nothing changed); starts a new step."""
        if not self.changed:
            return None
        update = BatchUpdate(
            batch_size=batch_size,
            removed=sorted(self._removed),
            added=list(self._added),
            moved=list(self._moved),
        )
        self._removed, self._added, self._moved = [], [], []
        return update
