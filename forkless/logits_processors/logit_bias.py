"""Built-in: add ``SamplingParams.logit_bias`` to the logits of the named tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from forkless.logits_processors.interface import LogitsProcessor
from forkless.logits_processors.state import process_dict_updates
from forkless.utils.torch_utils import async_tensor_h2d

if TYPE_CHECKING:
    from forkless.logits_processors.interface import BatchUpdate
    from forkless.sampling_params import SamplingParams


class LogitBiasLogitsProcessor(LogitsProcessor):
    """Implements ``SamplingParams.logit_bias`` (token id -> additive bias)."""

    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        self._rows: dict[int, dict[int, float]] = {}
        self._idx_rows = torch.empty(0, dtype=torch.long, device=device)
        self._idx_tokens = torch.empty(0, dtype=torch.long, device=device)
        self._bias = torch.empty(0, dtype=torch.float32, device=device)

    def is_argmax_invariant(self) -> bool:
        return False

    def is_active(self) -> bool:
        return bool(self._rows)

    @staticmethod
    def _new_state(
        params: "SamplingParams", _prompt: list[int] | None, _output: list[int]
    ) -> dict[int, float] | None:
        return params.logit_bias or None

    def update_state(self, batch_update: "BatchUpdate | None") -> None:
        if not process_dict_updates(self._rows, batch_update, self._new_state):
            return
        rows: list[int] = []
        tokens: list[int] = []
        biases: list[float] = []
        for row, bias in self._rows.items():
            rows.extend([row] * len(bias))
            tokens.extend(bias.keys())
            biases.extend(bias.values())
        self._idx_rows = async_tensor_h2d(rows, torch.long, self.device, self.is_pin_memory)
        self._idx_tokens = async_tensor_h2d(tokens, torch.long, self.device, self.is_pin_memory)
        self._bias = async_tensor_h2d(biases, torch.float32, self.device, self.is_pin_memory)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._rows:
            # Token ids are checked against the vocabulary when the request is accepted
            # (validate_request_params); index_put_ accumulates so duplicates add up.
            logits.index_put_((self._idx_rows, self._idx_tokens), self._bias, accumulate=True)
        return logits
