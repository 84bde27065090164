"""Built-in: ``SamplingParams.allowed_token_ids`` (only these tokens may be sampled)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from forkless.logits_processors.interface import LogitsProcessor
from forkless.logits_processors.state import process_dict_updates
from forkless.utils.torch_utils import async_tensor_h2d

if TYPE_CHECKING:
    from forkless.logits_processors.interface import BatchUpdate
    from forkless.sampling_params import SamplingParams


class AllowedTokenIdsLogitsProcessor(LogitsProcessor):
    """Sets the logit of every token outside a row's ``allowed_token_ids`` to -inf.

    Not argmax-invariant: greedy rows must pick among the allowed tokens too. The mask
    covers only the rows that restrict tokens and is rebuilt when those rows change.
    """

    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        self._rows: dict[int, list[int]] = {}
        self._index: torch.Tensor | None = None  # [R] rows that restrict tokens
        self._banned: torch.Tensor | None = None  # [R, vocab] True = not allowed

    def is_argmax_invariant(self) -> bool:
        return False

    def is_active(self) -> bool:
        return bool(self._rows)

    @staticmethod
    def _new_state(
        params: "SamplingParams", _prompt: list[int] | None, _output: list[int]
    ) -> list[int] | None:
        return params.allowed_token_ids or None

    def update_state(self, batch_update: "BatchUpdate | None") -> None:
        if process_dict_updates(self._rows, batch_update, self._new_state):
            # The vocabulary width is only known from the logits: build in apply().
            self._index = self._banned = None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._rows:
            return logits
        vocab = logits.shape[-1]
        if self._banned is None or self._banned.shape[-1] != vocab:
            self._build(vocab)
        assert self._index is not None and self._banned is not None
        logits[self._index] = logits[self._index].masked_fill_(self._banned, float("-inf"))
        return logits

    def _build(self, vocab: int) -> None:
        rows = sorted(self._rows)
        # Pinned on CUDA: from pageable memory the copy below may wait for the busy stream.
        banned = torch.ones((len(rows), vocab), dtype=torch.bool, pin_memory=self.is_pin_memory)
        for i, row in enumerate(rows):
            # Ids were checked against the vocabulary when the request was accepted
            # (validate_request_params); a narrower logits tensor still cannot index past.
            allowed = [t for t in self._rows[row] if t < vocab]
            banned[i, allowed] = False
        self._index = async_tensor_h2d(rows, torch.long, self.device, self.is_pin_memory)
        self._banned = banned.to(self.device, non_blocking=True)
