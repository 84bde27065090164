"""A helper that keeps a processor's ``row -> state`` dict aligned with the batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, TypeVar

from forkless.logits_processors.interface import MoveDirectionality

if TYPE_CHECKING:
    from forkless.logits_processors.interface import BatchUpdate
    from forkless.sampling_params import SamplingParams

T = TypeVar("T")


def process_dict_updates(
    entries: dict[int, T],
    batch_update: "BatchUpdate | None",
    new_state: Callable[["SamplingParams", "list[int] | None", "list[int]"], T | None],
) -> bool:
    """Apply a ``BatchUpdate`` (removed, added, moved) to a ``row -> state`` dict.

    Most processors only track the rows whose request uses them, which this does for them.

    Args:
        entries: The processor's per-row state, updated in place.
        batch_update: The step's update; ``None`` changes nothing.
        new_state: Maps an added request's (params, prompt ids, live output ids) to its
            state, or to ``None`` when the processor does not apply to it.

    Returns:
        Whether ``entries`` changed (so derived tensors must be rebuilt).
    """
    if batch_update is None:
        return False
    changed = False
    for index in batch_update.removed:
        changed |= entries.pop(index, None) is not None
    for index, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            entries[index] = state
            changed = True
        else:
            changed |= entries.pop(index, None) is not None
    for a, b, direction in batch_update.moved:
        a_state = entries.pop(a, None)
        b_state = entries.pop(b, None)
        if a_state is not None:
            entries[b] = a_state
            changed = True
        if b_state is not None:
            changed = True
            if direction is MoveDirectionality.SWAP:
                entries[a] = b_state
    return changed
