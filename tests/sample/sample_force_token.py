"""An example custom logits processor driven by ``SamplingParams.extra_args``.

Rows whose request has ``extra_args={"force_token": id}`` can only produce that token.
Selected in tests as ``--logits-processors sample_force_token:ForceTokenLogitsProcessor``.
"""

from __future__ import annotations

from typing import Any

import torch

from forkless import SamplingParams
from forkless.logits_processors import BatchUpdate, LogitsProcessor, process_dict_updates


class ForceTokenLogitsProcessor(LogitsProcessor):
    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        self.rows: dict[int, int] = {}

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        token = (params.extra_args or {}).get("force_token")
        if token is not None and (not isinstance(token, int) or token < 0):
            raise ValueError(f"extra_args.force_token={token!r} is invalid: expected a token id >= 0")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(
            self.rows, batch_update,
            lambda params, _prompt, _out: (params.extra_args or {}).get("force_token"),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, token in self.rows.items():
            keep = logits[row, token].clone()
            logits[row] = float("-inf")
            logits[row, token] = keep
        return logits


class NotAProcessor:
    pass
