"""A logits processor that makes the model write a given token sequence (test helper).

Requests with ``extra_args={"forced_token_ids": [...]}`` emit exactly those tokens, in
order, and then the last one again; end the list with the EOS id to stop there. With
``extra_args={"forced_prefix_ids": [...]}`` they emit those tokens first and then sample
as the model (and any constraint) would. Select it
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
        # row -> (forced ids, the request's live output ids, whether only as a prefix)
        self.rows: dict[int, tuple[list[int], list[int], bool]] = {}

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        for key in ("forced_token_ids", "forced_prefix_ids"):
            ids = (params.extra_args or {}).get(key)
            if ids is not None and (not isinstance(ids, list) or not ids
                                    or not all(isinstance(t, int) and t >= 0 for t in ids)):
                raise ValueError(f"extra_args.{key}={ids!r} is invalid: expected a non-empty list of token ids")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def state(params: SamplingParams, _prompt: Any, output: list[int]) -> Any:
            extra = params.extra_args or {}
            if extra.get("forced_prefix_ids"):
                return (extra["forced_prefix_ids"], output, True)
            ids = extra.get("forced_token_ids")
            return (ids, output, False) if ids else None

        process_dict_updates(self.rows, batch_update, state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (ids, output, prefix) in self.rows.items():
            if prefix and len(output) >= len(ids):
                continue  # past the prefix: the model's own logits
            token = ids[min(len(output), len(ids) - 1)]
            logits[row] = float("-inf")
            logits[row, token] = 0.0
        return logits


THINK_FOREVER = "force_tokens:ThinkForeverLogitsProcessor"


class ThinkForeverLogitsProcessor(LogitsProcessor):
    """A model that thinks until it is made to stop (test helper for thinking budgets).

    Requests with ``extra_args={"thinking_ids": [...], "end_ids": [...], "answer_ids":
    [...]}`` write ``thinking_ids`` and then its last token again and again; once their
    output holds ``end_ids`` (the end of the reasoning, which only the engine's budget
    forces), they write ``answer_ids`` (end it with the EOS id). A row that an earlier
    processor already forced (one finite logit left) is left as it is.
    """

    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        self.rows: dict[int, tuple[list[int], list[int], list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def state(params: SamplingParams, _prompt: Any, output: list[int]) -> Any:
            extra = params.extra_args or {}
            if "thinking_ids" not in extra:
                return None
            return extra["thinking_ids"], extra["end_ids"], extra["answer_ids"], output

        process_dict_updates(self.rows, batch_update, state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (thinking, end, answer, output) in self.rows.items():
            if int(torch.isfinite(logits[row]).sum()) == 1:
                continue  # forced already (the budget's end of the reasoning)
            after = next((i + len(end) for i in range(len(output) - len(end) + 1)
                          if output[i:i + len(end)] == end), None)
            if after is None:
                token = thinking[min(len(output), len(thinking) - 1)]
            else:
                token = answer[min(len(output) - after, len(answer) - 1)]
            logits[row] = float("-inf")
            logits[row, token] = 0.0
        return logits
