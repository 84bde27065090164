"""Logits processors written the way vLLM v1's examples write them, with only the imports
renamed (``vllm`` -> ``forkless``): a batch-level one, and per-request functions wrapped
in vLLM's ``AdapterLogitsProcessor``."""

from __future__ import annotations

import torch

from forkless import SamplingParams
from forkless.config import VllmConfig
from forkless.logits_process import LogitsProcessor as RequestLogitsProcessor
from forkless.v1.sample.logits_processor import AdapterLogitsProcessor, BatchUpdate, LogitsProcessor
from forkless.v1.sample.logits_processor.builtin import process_dict_updates


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
        def target_of(params: SamplingParams, _prompt_ids, _output_ids):
            return params.extra_args and params.extra_args.get("target_token")

        process_dict_updates(self.req_info, batch_update, target_of)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.req_info:
            return logits
        rows = torch.tensor(list(self.req_info), dtype=torch.long)
        cols = torch.tensor(list(self.req_info.values()), dtype=torch.long)
        kept = logits[rows, cols].clone()
        logits[rows] = float("-inf")
        logits[rows, cols] = kept
        return logits


def _force(token: int, logits: torch.Tensor) -> torch.Tensor:
    forced = torch.full_like(logits, float("-inf"))
    forced[token] = 0.0
    return forced


class PerRequestLogitsProcessor(AdapterLogitsProcessor):
    """vLLM's wrapper around per-request functions: ``extra_args["force_token"]`` forces a
    token (a two-argument function); ``extra_args["echo_prompt"]`` makes the output repeat
    the prompt, token after token (a three-argument function, which also gets the prompt)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        super().__init__(vllm_config, device, is_pin_memory)

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: SamplingParams) -> RequestLogitsProcessor | None:
        extra = params.extra_args or {}
        if "force_token" in extra:
            token = extra["force_token"]

            def force(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
                return _force(token, logits)

            return force
        if extra.get("echo_prompt"):
            def echo(prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
                logits[:] = float("-inf")  # in place: the adapter keeps the row as it is
                logits[prompt_ids[len(output_ids) % len(prompt_ids)]] = 0.0
                return logits

            return echo
        return None
