"""A logits processor written the way vLLM v1's docs write one, with only the imports
renamed (``vllm`` -> ``forkless``)."""

from __future__ import annotations

import torch

from forkless import SamplingParams
from forkless.config import VllmConfig
from forkless.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality


class TargetTokenLogitsProcessor(LogitsProcessor):
    """Forces ``extra_args["target_token"]`` for the requests that ask for it."""

    @classmethod
    def validate_params(cls, params: SamplingParams):
        target = params.extra_args and params.extra_args.get("target_token")
        if target is not None and not isinstance(target, int):
            raise ValueError(f"target_token value {target} is not int")

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        self.req_info: dict[int, int] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None):
        if not batch_update:
            return
        for index in batch_update.removed:
            self.req_info.pop(index, None)
        for index, params, _, _ in batch_update.added:
            target = params.extra_args and params.extra_args.get("target_token")
            if target is not None:
                self.req_info[index] = target
            else:
                self.req_info.pop(index, None)
        for a, b, direction in batch_update.moved:
            a_val, b_val = self.req_info.pop(a, None), self.req_info.pop(b, None)
            if a_val is not None:
                self.req_info[b] = a_val
            if direction == MoveDirectionality.SWAP and b_val is not None:
                self.req_info[a] = b_val

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.req_info:
            return logits
        rows = torch.tensor(list(self.req_info), dtype=torch.long)
        cols = torch.tensor(list(self.req_info.values()), dtype=torch.long)
        kept = logits[rows, cols].clone()
        logits[rows] = float("-inf")
        logits[rows, cols] = kept
        return logits
