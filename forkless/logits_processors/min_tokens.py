"""Built-in: mask EOS and stop tokens until a request has ``min_tokens`` outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from forkless.logits_processors.interface import LogitsProcessor
from forkless.logits_processors.state import process_dict_updates
from forkless.utils.torch_utils import async_tensor_h2d

if TYPE_CHECKING:
    from forkless.logits_processors.interface import BatchUpdate
    from forkless.sampling_params import SamplingParams


class MinTokensLogitsProcessor(LogitsProcessor):
    """Implements ``SamplingParams.min_tokens`` over ``all_stop_token_ids``."""

    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        # row -> (min_tokens, live output ids, ids to mask)
        self._rows: dict[int, tuple[int, list[int], list[int]]] = {}
        self._mask_rows = torch.empty(0, dtype=torch.long, device=device)
        self._mask_tokens = torch.empty(0, dtype=torch.long, device=device)

    def is_argmax_invariant(self) -> bool:
        return False

    def is_active(self) -> bool:
        return bool(self._rows)

    @staticmethod
    def _new_state(
        params: "SamplingParams", _prompt: list[int] | None, output_ids: list[int]
    ) -> tuple[int, list[int], list[int]] | None:
        stop_ids = sorted(params.all_stop_token_ids)
        if params.min_tokens and stop_ids and len(output_ids) < params.min_tokens:
            return params.min_tokens, output_ids, stop_ids
        return None

    def update_state(self, batch_update: "BatchUpdate | None") -> None:
        changed = process_dict_updates(self._rows, batch_update, self._new_state)
        # Output lists grow between steps without a BatchUpdate; release rows that got there.
        done = [row for row, (need, out, _) in self._rows.items() if len(out) >= need]
        for row in done:
            del self._rows[row]
        if changed or done:
            rows: list[int] = []
            tokens: list[int] = []
            for row, (_, _, stop_ids) in self._rows.items():
                rows.extend([row] * len(stop_ids))
                tokens.extend(stop_ids)
            self._mask_rows = async_tensor_h2d(rows, torch.long, self.device, self.is_pin_memory)
            self._mask_tokens = async_tensor_h2d(tokens, torch.long, self.device, self.is_pin_memory)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._rows:
            vocab = logits.shape[-1]
            # An EOS id beyond the logits (a padded tokenizer) cannot be sampled anyway.
            keep = self._mask_tokens < vocab
            logits[self._mask_rows[keep], self._mask_tokens[keep]] = float("-inf")
        return logits
