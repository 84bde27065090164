"""Built-in: ``SamplingParams.bad_words`` (vLLM semantics).

Invariants:
    * Only the generated tokens are matched, never the prompt.
    * The processor reads each row's live output list, so the row's latest token must
      be in it: the scheduler keeps requests with bad words out of async steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from forkless.logits_processors.interface import LogitsProcessor
from forkless.logits_processors.state import process_dict_updates
from forkless.utils.torch_utils import async_tensor_h2d

if TYPE_CHECKING:
    from forkless.logits_processors.interface import BatchUpdate
    from forkless.sampling_params import SamplingParams


class BadWordsLogitsProcessor(LogitsProcessor):
    """Bans the last token of a bad word's token sequence when the output ends with the
    rest of that sequence (a one-token word is always banned).

    Reads ``SamplingParams.bad_words_token_ids``; the front end's ``Processor`` fills it
    from ``bad_words`` with the model's tokenizer before the request reaches the engine.
    """

    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(config, device, is_pin_memory)
        # row -> (token sequences, the live list of generated tokens)
        self._rows: dict[int, tuple[list[list[int]], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def is_active(self) -> bool:
        return bool(self._rows)

    @staticmethod
    def _new_state(
        params: "SamplingParams", _prompt: list[int] | None, output_ids: list[int]
    ) -> tuple[list[list[int]], list[int]] | None:
        if not params.bad_words:
            return None
        if params.bad_words_token_ids is None:
            # Silently not banning anything would break the request's contract.
            raise RuntimeError(
                "SamplingParams.bad_words reached the logits processor untokenized; call "
                "SamplingParams.update_from_tokenizer(tokenizer) first"
            )
        return params.bad_words_token_ids, output_ids

    def update_state(self, batch_update: "BatchUpdate | None") -> None:
        process_dict_updates(self._rows, batch_update, self._new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._rows:
            return logits
        vocab = logits.shape[-1]
        rows: list[int] = []
        tokens: list[int] = []
        for row, (sequences, output) in self._rows.items():
            n = len(output)
            for seq in sequences:
                prefix = len(seq) - 1
                if prefix > n or seq[-1] >= vocab:
                    continue  # cannot complete yet / cannot be sampled anyway
                if prefix == 0 or output[n - prefix:] == seq[:-1]:
                    rows.append(row)
                    tokens.append(seq[-1])
        if rows:
            index = async_tensor_h2d([rows, tokens], torch.long, self.device, self.is_pin_memory)
            logits[index[0], index[1]] = float("-inf")
        return logits
