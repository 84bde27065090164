"""Custom classes selected by path in the engine tests (``--logits-processors``,
``--scheduler-cls``)."""

from __future__ import annotations

from typing import Any

import torch

from forkless.core.sched import Scheduler
from forkless.logits_processors import BatchUpdate, LogitsProcessor, process_dict_updates
from forkless.sampling_params import SamplingParams


class ForceTokenProcessor(LogitsProcessor):
    """Rows whose request has ``extra_args={"force_token": id}`` can only produce that token."""

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
            self.rows, batch_update, lambda params, _p, _o: (params.extra_args or {}).get("force_token")
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, token in self.rows.items():
            logits[row] = float("-inf")
            logits[row, token] = 0.0
        return logits


class CountingScheduler(Scheduler):
    """The default scheduler, counting its steps (proves the class was used)."""

    steps = 0

    def schedule(self):  # type: ignore[no-untyped-def]
        type(self).steps += 1
        return super().schedule()
