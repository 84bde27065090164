"""``ngram``: prompt lookup decoding (the guess is what followed the same words before).

For each request, the last ``n`` tokens of its history (prompt + output), for ``n`` from
``prompt_lookup_max`` down to ``prompt_lookup_min``, are looked up in the rest of the
history; at the longest ``n`` that occurs, the tokens that followed its latest earlier
occurrence are the draft (up to ``num_speculative_tokens``, fewer when the history ends
first). No occurrence: no draft.

Invariants:
    * The lookup is vectorised over the history with numpy (one comparison with the last
      token finds every candidate, which are then extended backwards together); Python
      loops only over requests and over the few ``n``.
    * An occurrence must end before the last token, so the suffix never matches itself,
      and a draft never reads past the history.
    * The latest occurrence wins: in text that repeats, the nearest repetition is the most
      likely to continue the same way (and in code edits, the most recent version).
    * A request whose drafts keep being rejected gets fewer of them: after ``m >= 2``
      drafts in a row of which the target kept nothing, the next ``min(2 ** (m - 1),
      MAX_BACKOFF)`` lookups for it are skipped, and one kept draft token ends the streak.
      A rejected draft costs a verification of ``1 + k`` positions and the rejection
      sampler for one token, so text that does not repeat decodes at about the plain
      speed, while text that does keeps its drafts. Whether a draft was kept is read off
      the history (the tokens that followed it), up to the drafts the step scored
      (``ProposalBatch.num_verified``: a draft never scored, because the step had no room
      or ran before it was known, says nothing either way); the state of a request that
      leaves the batch is dropped (it starts afresh).
    * A request's draft length follows how much of its drafts the target keeps: halved
      (down to 1) after a draft the target cut short, doubled (up to
      ``num_speculative_tokens``) after one it kept whole. Each drafted position costs a
      verified position whether kept or not, so a request whose drafts are right only
      for a token or two stops paying for the rest, and one whose drafts are right gets
      them back within a few steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forkless.spec_decode.config import SpeculativeConfig
from forkless.spec_decode.interface import ProposalBatch, Proposer

#: Most lookups skipped after a streak of rejected drafts.
MAX_BACKOFF = 16


def propose_ngram(history: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The draft for one token history.

    The longest suffix of ``n <= max_n`` tokens that occurred before wins; among its
    occurrences, the latest. Found from the occurrences of the last token alone (one
    comparison over the history), each extended backwards up to ``max_n`` tokens, so the
    cost is a handful of numpy calls whatever ``max_n``.

    Args:
        history: 1-D int array, the request's tokens in order.
        min_n: Shortest suffix looked up.
        max_n: Longest suffix looked up.
        k: Most draft tokens.

    Returns:
        A 1-D int array of 0 to ``k`` tokens.
    """
    length = len(history)
    # Where earlier occurrences end: the last token's occurrences before the last position.
    ends = np.flatnonzero(history[: length - 1] == history[length - 1])
    if ends.size == 0 or min_n > length - 1:
        return history[:0]
    # matched[c]: how many tokens, counted backwards from ends[c], equal the suffix's.
    matched = np.ones(ends.size, dtype=np.int64)
    alive = np.ones(ends.size, dtype=bool)
    for j in range(1, min(max_n, length - 1)):
        prev = ends - j
        alive &= prev >= 0
        alive[alive] = history[prev[alive]] == history[length - 1 - j]
        if not alive.any():
            break
        matched += alive
    n = int(matched.max())
    if n < min_n:
        return history[:0]
    start = int(ends[np.flatnonzero(matched >= n)[-1]]) + 1
    return history[start : start + k]


class NgramProposer(Proposer):
    """Prompt lookup over each request's own tokens (``"method": "ngram"``)."""

    def __init__(self, config: SpeculativeConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        assert config.prompt_lookup_min is not None and config.prompt_lookup_max is not None
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        # Request id -> (its last draft, history length then, rejected streak, lookups to
        # skip, draft length now).
        self._last: dict[str, tuple[list[int], int, int, int, int]] = {}

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        k = self.num_speculative_tokens
        drafts: list[list[int]] = []
        last: dict[str, tuple[list[int], int, int, int, int]] = {}
        for i, rid in enumerate(batch.request_ids):
            n = int(batch.num_tokens[i])
            history = batch.token_ids[i, :n]
            previous, then, streak, skip, size = self._last.get(rid, ([], 0, 0, 0, k))
            scored = len(previous) if batch.num_verified is None else min(int(batch.num_verified[i]), len(previous))
            if scored and n > then:
                # The target kept the draft's tokens that the old history goes on with.
                kept = 0
                while kept < scored and then + kept < n and int(history[then + kept]) == previous[kept]:
                    kept += 1
                streak = 0 if kept else streak + 1
                skip = min(2 ** (streak - 1), MAX_BACKOFF) if streak >= 2 else 0
                size = min(2 * size, k) if kept == scored else max(size // 2, 1)
            if skip:
                skip -= 1
                draft: list[int] = []
            else:
                draft = propose_ngram(history, self.min_n, self.max_n, size).tolist()
            last[rid] = (draft, n, streak, skip, size)
            drafts.append(draft)
        self._last = last
        return drafts
