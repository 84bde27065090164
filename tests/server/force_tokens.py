"""A logits processor that makes the model write a given token sequence (test helper).

Requests with ``extra_args={"forced_token_ids": [...]}`` emit exactly those tokens, in
order, and then the last one again; end the list with the EOS id to stop there. Select it
with ``--logits-processors force_tokens:ForceTokensLogitsProcessor`` and this folder on
``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any

import torch

from forkless import SamplingParams
from forkless.logits_processors import BatchUpdate, LogitsProcessor, process_dict_updates

PATH = "force_tokens:ForceTokensLogitsProcessor"


class ForceTokensLogitsProcessor(LogitsProcessor):
    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        # row -> (forced ids, the request's live output ids)
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        ids = (params.extra_args or {}).get("forced_token_ids")
        if ids is not None and (not isinstance(ids, list) or not ids
                                or not all(isinstance(t, int) and t >= 0 for t in ids)):
            raise ValueError(f"extra_args.forced_token_ids={ids!r} is invalid: expected a non-empty list of token ids")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def state(params: SamplingParams, _prompt: Any, output: list[int]) -> Any:
            ids = (params.extra_args or {}).get("forced_token_ids")
            return (ids, output) if ids else None

        process_dict_updates(self.rows, batch_update, state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (ids, output) in self.rows.items():
            token = ids[min(len(output), len(ids) - 1)]
            logits[row] = float("-inf")
            logits[row, token] = 0.0
        return logits
