"""Built-in: ``SamplingParams.min_p`` filtering."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from forkless.logits_processors.interface import LogitsProcessor
from forkless.logits_processors.state import process_dict_updates
from forkless.utils.torch_utils import async_tensor_h2d

if TYPE_CHECKING:
    from forkless.logits_processors.interface import BatchUpdate
    from forkless.sampling_params import SamplingParams


class MinPLogitsProcessor(LogitsProcessor):
    """Drops tokens whose probability is below ``min_p`` times the row's top probability.

    Argmax-invariant (the top token always survives), so the sampler runs it only for
    random rows, after temperature: min_p is relative to the tempered distribution.
    """

    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        self._rows: dict[int, float] = {}
        self._batch_size = 0
        self._min_p: torch.Tensor | None = None

    def is_argmax_invariant(self) -> bool:
        return True

    def is_active(self) -> bool:
        return bool(self._rows)

    @staticmethod
    def _new_state(
        params: "SamplingParams", _prompt: list[int] | None, _output: list[int]
    ) -> float | None:
        return params.min_p if params.min_p > 0.0 else None

    def update_state(self, batch_update: "BatchUpdate | None") -> None:
        changed = process_dict_updates(self._rows, batch_update, self._new_state)
        if batch_update is not None and batch_update.batch_size != self._batch_size:
            self._batch_size = batch_update.batch_size
            changed = True
        if not changed:
            return
        if not self._rows:
            self._min_p = None
            return
        values = [0.0] * self._batch_size
        for row, min_p in self._rows.items():
            values[row] = min_p
        self._min_p = async_tensor_h2d(values, torch.float32, self.device, self.is_pin_memory).unsqueeze(1)

    def row_min_p(self) -> torch.Tensor | None:
        """Each row's ``min_p`` (0: none), ``[batch_size]`` float32 on the device, or
        ``None`` when no row has one: what the sampler's race kernels take in place of
        :meth:`apply` (the same set, without its float32 passes over the logits)."""
        return None if self._min_p is None else self._min_p.view(-1)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._min_p is None:
            return logits
        # p < min_p * p_max  <=>  logit < max_logit + log(min_p): no softmax needed, and
        # log(0) = -inf keeps rows without min_p untouched.
        threshold = logits.amax(dim=-1, keepdim=True) + torch.log(self._min_p)
        return logits.masked_fill_(logits < threshold, float("-inf"))
