"""Built-in: ``SamplingParams.thinking_token_budget`` (vLLM semantics).

A request's reasoning runs from its latest start marker (``<think>``) to the end marker
(``</think>``) after it. Once ``thinking_token_budget`` tokens follow the start marker,
the row's next tokens are forced, one a step, to be the end marker's tokens; then the
model answers as it would. The markers are token sequences (``--reasoning-config``, or the
reasoning parser's tags), carried by the request (``reasoning_start_token_ids``,
``reasoning_end_token_ids``, which the front end's ``Processor`` fills).

Invariants:
    * The state is derived from the token history (prompt, then output) alone, so a
      resumed or preempted request, or one whose prompt already opened the reasoning
      (a template that writes ``<think>``), is counted as vLLM counts it: the prompt's
      tokens after its last start marker are reasoning too, and a prompt already past
      the budget ends the reasoning with the first generated tokens.
    * The tokens at and after the budget's position are the end marker's, in order: a
      forced token that something else replaced (a later processor) restarts the marker.
      A new start marker after the end starts a new count.
    * Forcing sets every other logit of the row to ``-inf`` (as vLLM's model runner V2
      does), so no other processor or sampling setting can pick another token. This
      processor is the last built-in, after ``allowed_token_ids`` and ``bad_words``.
    * The processor reads each row's live output list, whose latest token must be in
      it: the scheduler keeps requests with a budget out of async steps, and they do
      not speculate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from forkless.logits_processors.interface import LogitsProcessor
from forkless.logits_processors.state import process_dict_updates
from forkless.utils.torch_utils import async_tensor_h2d

if TYPE_CHECKING:
    from forkless.logits_processors.interface import BatchUpdate
    from forkless.sampling_params import SamplingParams


@dataclass
class _Row:
    """One request's budget and where its markers last were.

    Positions count over the history: the prompt's tokens, then the output's.
    """

    budget: int
    start: list[int]
    end: list[int]
    prompt: list[int]
    output: list[int]  # the batch's live list
    last_start: int = -1
    last_end: int = -1
    scanned: int = 0  # positions below this were looked at for a marker starting there

    def token(self, i: int) -> int:
        n = len(self.prompt)
        return self.prompt[i] if i < n else self.output[i - n]

    def matches(self, i: int, marker: list[int], length: int) -> bool:
        """Whether ``marker`` starts at position ``i`` and ends before ``length``."""
        return i + len(marker) <= length and all(self.token(i + j) == t for j, t in enumerate(marker))

    def scan(self) -> int:
        """Find the markers among the tokens added since the last call; returns the
        history's length."""
        length = len(self.prompt) + len(self.output)
        if not self.scanned:
            # The whole history (a long prompt): only the latest marker matters, so look
            # backwards and stop at it. A start found first is the latest start, any end
            # is before it; an end found first closes every start before it.
            for i in range(length - 1, -1, -1):
                is_start, is_end = self.matches(i, self.start, length), self.matches(i, self.end, length)
                if is_start:
                    self.last_start = i
                if is_end:
                    self.last_end = i
                if is_start or is_end:
                    break
            self.scanned = length
            return length
        longest = max(len(self.start), len(self.end))
        # A marker ending in the new tokens may start up to longest - 1 positions back.
        for i in range(max(0, self.scanned - longest + 1), length):
            if self.matches(i, self.start, length):
                self.last_start = max(self.last_start, i)
            if self.matches(i, self.end, length):
                self.last_end = max(self.last_end, i)
        self.scanned = length
        return length

    def forced(self) -> int | None:
        """The token the next step must produce, or ``None`` when it is free."""
        length = self.scan()
        if self.last_start < 0 or self.last_start <= self.last_end:
            return None  # not reasoning (never started, or ended after its latest start)
        # The first position past the budget (never inside the prompt: that is given).
        first = max(self.last_start + len(self.start) + self.budget, len(self.prompt))
        past = length - first
        if past < 0:
            return None
        # The end marker's tokens written since then, as far as they go in order.
        done = 0
        for k in range(min(past, len(self.end) - 1), 0, -1):
            if all(self.token(length - k + j) == self.end[j] for j in range(k)):
                done = k
                break
        return self.end[done]


class ThinkingTokenBudgetLogitsProcessor(LogitsProcessor):
    """Forces the end of the reasoning once a request's ``thinking_token_budget`` is
    spent (vLLM's processor of the same name)."""

    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        self._rows: dict[int, _Row] = {}
        # row -> the token it must produce this step
        self._forced: dict[int, int] = {}
        self._index = torch.empty((2, 0), dtype=torch.long, device=device)

    def is_argmax_invariant(self) -> bool:
        return False

    def is_active(self) -> bool:
        return bool(self._forced)

    @staticmethod
    def _new_state(params: "SamplingParams", prompt: list[int] | None, output: list[int]) -> _Row | None:
        if params.thinking_token_budget is None:
            return None
        start, end = params.reasoning_start_token_ids, params.reasoning_end_token_ids
        if not start or not end:
            # Silently not limiting the reasoning would break the request's contract.
            raise RuntimeError("SamplingParams.thinking_token_budget reached the logits processor without the "
                               "reasoning markers (reasoning_start_token_ids / reasoning_end_token_ids); the "
                               "engine's Processor fills them")
        return _Row(params.thinking_token_budget, list(start), list(end), list(prompt or ()), output)

    def update_state(self, batch_update: "BatchUpdate | None") -> None:
        process_dict_updates(self._rows, batch_update, self._new_state)
        forced = {}
        for index, row in self._rows.items():
            token = row.forced()
            if token is not None:
                forced[index] = token
        if forced != self._forced:
            self._forced = forced
            self._index = async_tensor_h2d([list(forced), list(forced.values())], torch.long,
                                           self.device, self.is_pin_memory).reshape(2, -1)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._forced:
            return logits
        rows, tokens = self._index[0], self._index[1]
        # A marker token beyond the logits (a tokenizer larger than the model's vocabulary)
        # cannot be sampled: such a row is left free rather than left with nothing.
        keep = tokens < logits.shape[-1]
        rows, tokens = rows[keep], tokens[keep]
        logits[rows] = float("-inf")
        logits[rows, tokens] = 0.0
        return logits
