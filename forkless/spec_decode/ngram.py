"""``ngram``: prompt lookup decoding (the guess is what followed the same words before).

For each request, the last ``n`` tokens of its history (prompt + output), for ``n`` from
``prompt_lookup_max`` down to ``prompt_lookup_min``, are looked up in the rest of the
history; at the longest ``n`` that occurs, the tokens that followed its latest earlier
occurrence are the draft (up to ``num_speculative_tokens``, fewer when the history ends
first). No occurrence: no draft.

Invariants:
    * The lookup is vectorised over the history with numpy (sliding windows compared at
      once); Python loops only over requests and over the few ``n``.
    * An occurrence must end before the last token, so the suffix never matches itself,
      and a draft never reads past the history.
    * The latest occurrence wins: in text that repeats, the nearest repetition is the most
      likely to continue the same way (and in code edits, the most recent version).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from forkless.spec_decode.config import SpeculativeConfig
from forkless.spec_decode.interface import ProposalBatch, Proposer


def propose_ngram(history: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The draft for one token history.

    Args:
        history: 1-D int array, the request's tokens in order.
        min_n: Shortest suffix looked up.
        max_n: Longest suffix looked up.
        k: Most draft tokens.

    Returns:
        A 1-D int array of 0 to ``k`` tokens.
    """
    length = len(history)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # Windows that start at 0 .. length-n-1: every earlier occurrence, never the
        # suffix itself (which starts at length-n).
        windows = sliding_window_view(history[: length - 1], n)
        hits = np.flatnonzero((windows == history[length - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return history[start : start + k]
    return history[:0]


class NgramProposer(Proposer):
    """Prompt lookup over each request's own tokens (``"method": "ngram"``)."""

    def __init__(self, config: SpeculativeConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        assert config.prompt_lookup_min is not None and config.prompt_lookup_max is not None
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        k = self.num_speculative_tokens
        return [propose_ngram(batch.token_ids[i, : int(n)], self.min_n, self.max_n, k).tolist()
                for i, n in enumerate(batch.num_tokens)]
