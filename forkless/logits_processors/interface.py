"""The batch-level logits processor interface (same contract as vLLM v1).

A logits processor sees the whole persistent batch at once: it keeps per-row state that it
updates from a ``BatchUpdate`` every step, and transforms the ``[num_reqs, vocab]`` logits
in ``apply``. This module is torch-free at import time so that the API server can validate
request arguments (``validate_params``) without loading torch.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    import torch

    from forkless.sampling_params import SamplingParams


class MoveDirectionality(enum.Enum):
    """How a ``BatchUpdate.moved`` entry relocates rows."""

    UNIDIRECTIONAL = enum.auto()  # row a moves to b; whatever was at b is gone
    SWAP = enum.auto()  # rows a and b trade places


# (row index, params, prompt token ids, output token ids). The output list is the live
# list the batch appends to, so a processor that keeps a reference always sees the tokens
# generated so far without further updates.
AddedRequest = tuple[int, "SamplingParams", "list[int] | None", "list[int]"]
# (from row, to row, directionality)
MovedRequest = tuple[int, int, MoveDirectionality]
RemovedRequest = int


@dataclass(frozen=True)
class BatchUpdate:
    """How the persistent batch changed since the previous step.

    Apply the three lists in this order: ``removed``, then ``added``, then ``moved``
    (in list order). An added or moved row may replace a row already at that index.

    Attributes:
        batch_size: Number of rows after the update; ``apply`` gets this many rows.
        removed: Rows whose request left the batch.
        added: Requests that joined, with the row they occupy.
        moved: Rows relocated within the batch (condensing holes, reordering).
    """

    batch_size: int
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


@stability(Stability.PROVISIONAL)
class LogitsProcessor(ABC):
    """A batch-level transformation of the logits, run in the workers.

    Select custom ones with ``--logits-processors pkg.mod:Class`` or the
    ``forkless.logits_processors`` entry-point group. A processor reads its per-request
    arguments from ``SamplingParams.extra_args`` (built-ins use named fields).

    Args:
        config: The engine configuration (read-only).
        device: Where the logits live; keep state tensors there.
        is_pin_memory: Whether pinned host memory may be used for staging copies.
    """

    def __init__(self, config: Any, device: "torch.device", is_pin_memory: bool) -> None:
        self.config = config
        self.device = device
        self.is_pin_memory = is_pin_memory

    @abstractmethod
    def apply(self, logits: "torch.Tensor") -> "torch.Tensor":
        """Transform the logits of every row (in place or not).

        Args:
            logits: ``[batch_size, vocab_size]`` float32 logits, rows in batch order.

        Returns:
            The transformed logits, same shape.
        """

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """Whether ``apply`` never changes a row's argmax.

        Returns:
            True lets the sampler skip this processor for greedy rows (e.g. min_p);
            False makes it run on every step (e.g. logit_bias).
        """

    def is_active(self) -> bool:
        """Whether ``apply`` may change any logit this step (asked after ``update_state``).

        Returns:
            True (the default) runs it as usual; False lets the sampler skip it, and a
            batch of greedy rows with nothing active then takes its argmax on the model's
            logits as they come (no float32 copy). The built-ins answer from their rows.
        """
        return True

    def needs_output_token_ids(self) -> bool:
        """Whether ``apply`` reads the generated token ids (vLLM's hook).

        vLLM's asynchronous scheduling fills the output lists with placeholders unless a
        processor answers True; forkless's lists always hold the real tokens (a worker
        appends each token it samples before the next step), so forkless never asks.
        Kept so that ported processors that override or call it run unchanged.

        Returns:
            False.
        """
        return False

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Bring per-row state in line with the batch; called once per step before apply.

        Args:
            batch_update: What changed since the previous step, or ``None`` when the
                rows are the same (new tokens may still have been appended).
        """

    @classmethod
    def validate_params(cls, params: "SamplingParams") -> None:
        """Reject a request whose arguments this processor cannot honour.

        Runs in the API server before the request reaches a worker, so a bad argument is
        a 400 error for that request instead of a failure in the batch.

        Args:
            params: The request's parameters (custom arguments in ``extra_args``).

        Raises:
            ValueError: An argument is invalid; say which and what was expected.
        """


class LogitsProcessorError(RuntimeError):
    """A logits processor raised, or returned what the sampler cannot use; the message
    names its class and the method.

    The step fails as before (the processor's rows cannot be trusted), but the engine's
    last words name the plugin instead of only the exception deep inside it.
    """

    @classmethod
    def wrap(cls, processor: LogitsProcessor, method: str, error: Exception) -> LogitsProcessorError:
        kind = type(processor)
        return cls(f"logits processor {kind.__module__}.{kind.__qualname__} raised in {method}(): "
                   f"{type(error).__name__}: {error}")

    @classmethod
    def bad_result(cls, processor: LogitsProcessor, method: str, got: str, expected: str) -> LogitsProcessorError:
        """The error for a processor whose ``method`` returned ``got`` (a description of the
        value) instead of ``expected``."""
        kind = type(processor)
        return cls(f"logits processor {kind.__module__}.{kind.__qualname__} returned {got} from {method}(): "
                   f"expected {expected}")
