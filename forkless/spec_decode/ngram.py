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
    * Drafting is gated on its expected benefit, per request. A step that verifies
      drafts costs more than a decode step: once (``VERIFY_STEP_COST``: the rejection
      sampler, the verified positions' way through the model) and per drafted position,
      kept or not (``DRAFT_TOKEN_COST``: one more row through every layer), both as
      fractions of a decode step; and a draft token pays only if the target keeps it. So
      each request keeps an estimate ``p`` of the chance that the target keeps a draft
      token given that it kept the ones before it: ``kept / tried`` over its scored
      drafts, each count an exponential moving average (factor ``DECAY`` a draft;
      ``tried`` is the kept tokens plus the one rejected, if any), starting from
      ``PRIOR_KEPT / PRIOR_TRIED`` (0.1). Token ``j`` of a draft is kept with chance
      ``p ** j``, so the draft length ``L`` is the largest ``j <= num_speculative_tokens``
      with ``p ** j > DRAFT_TOKEN_COST``, and the request drafts only if the ``L`` tokens
      are worth the step's cost too: ``p + ... + p ** L > VERIFY_STEP_COST + L *
      DRAFT_TOKEN_COST`` (about ``p > 0.15``). Text that repeats keeps long drafts; text
      that does not stops drafting after a draft or two. A new request starts below
      the cost, so its first draft is a probe (below): kept, the next drafts have
      ``num_speculative_tokens`` tokens (``p`` 0.54); rejected, it goes on probing (``p``
      0.05). (Starting at 0.2, with a 1-token draft from any suffix, cost 2-3 % at batch
      8 without repetition: every new request paid one verification.)
    * A request whose ``p`` is below the cost still probes, so that it notices when its
      text starts to repeat: a 1-token draft, from a suffix of at least 2 tokens (when
      ``prompt_lookup_max`` allows: a single token recurs by chance in any text, two in a
      row much less), at the proposer's steps that are multiples of its backoff ``b``,
      ``b`` doubling from 1 after each probe up to ``MAX_BACKOFF`` (a lookup that finds
      nothing is no probe; a kept probe raises ``p`` and may turn drafting back on; back
      above the cost, ``b`` starts again from 1). The steps are counted by the proposer,
      not per request, and every ``b`` is a power of two, so the probes of a batch's
      requests fall on the same steps: a step that verifies anything pays for the
      verification once (the rejection sampler, the verified rows' way through the
      model) besides its rows, and a probe that shares it costs only its row. A step
      that skips the lookup costs nothing.
    * Whether a draft's tokens were kept is read off the history (the tokens that followed
      it), up to the drafts the step scored (``ProposalBatch.num_verified``: a draft never
      scored, because the step had no room or ran before it was known, says nothing
      either way, and a scored prefix kept whole shows no rejection); the state of a
      request that leaves the batch is dropped (it starts afresh).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forkless.spec_decode.config import SpeculativeConfig
from forkless.spec_decode.interface import ProposalBatch, Proposer

#: Most steps between two probes of a request whose drafts do not pay (a power of 2).
MAX_BACKOFF = 32
#: What a step that verifies drafts costs besides a decode step, as a fraction of one:
#: once per step, and once per drafted position. Measured on two Xeon cores with the
#: default model (the decode step 28 ms at batch 1, 37 ms at batch 8): about 3-4 ms a
#: step and 1-2 ms a position at both batch sizes.
VERIFY_STEP_COST = 0.1
DRAFT_TOKEN_COST = 0.05
#: Weight of the past in the acceptance estimate, per scored draft.
DECAY = 0.7
#: The estimate's starting counts: kept and tried draft tokens (a chance of 0.1, below
#: the cost: a new request's first draft is a probe).
PRIOR_KEPT, PRIOR_TRIED = 0.15, 1.5


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


def draft_length(p: float, k: int) -> int:
    """How many draft tokens pay at per-token keep chance ``p`` (see the module's
    invariants): the largest ``j <= k`` with ``p ** j > DRAFT_TOKEN_COST``, or 0 when
    those tokens do not pay for the verification step."""
    length, gain = 0, 0.0
    while length < k and p ** (length + 1) > DRAFT_TOKEN_COST:
        length += 1
        gain += p**length
    return length if gain > VERIFY_STEP_COST + length * DRAFT_TOKEN_COST else 0


@dataclass
class _RequestState:
    """What the proposer remembers of one request between steps.

    Attributes:
        draft: The last draft proposed.
        then: The history's length when it was proposed (where its tokens would follow).
        kept: Moving average of the draft tokens the target kept.
        tried: Moving average of the draft tokens it judged (kept + rejected).
        backoff: Steps between this request's probes while its drafts do not pay.
    """

    draft: list[int] = field(default_factory=list)
    then: int = 0
    kept: float = PRIOR_KEPT
    tried: float = PRIOR_TRIED
    backoff: int = 1

    def learn(self, history: np.ndarray, scored: int) -> None:
        """Update the estimate with the last draft's first ``scored`` tokens, judged by
        the ``history`` that followed them."""
        n = len(history)
        kept = 0
        while kept < scored and self.then + kept < n and int(history[self.then + kept]) == self.draft[kept]:
            kept += 1
        # The tokens up to the first rejected one were judged; a prefix kept whole
        # shows no rejection.
        self.kept = DECAY * self.kept + kept
        self.tried = DECAY * self.tried + kept + (kept < scored)

    def next_length(self, k: int, clock: int) -> tuple[int, bool]:
        """The draft's length at the proposer's step ``clock`` (0: none), and whether it
        is a probe."""
        length = draft_length(self.kept / self.tried, k)
        if length:
            self.backoff = 1
            return length, False
        if clock % self.backoff:
            return 0, False
        return 1, True

    def probed(self) -> None:
        """A probe went out: the next one waits twice as long."""
        self.backoff = min(2 * self.backoff, MAX_BACKOFF)


class NgramProposer(Proposer):
    """Prompt lookup over each request's own tokens (``"method": "ngram"``)."""

    def __init__(self, config: SpeculativeConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        assert config.prompt_lookup_min is not None and config.prompt_lookup_max is not None
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self._state: dict[str, _RequestState] = {}
        # Calls of propose(): the clock the probes are aligned to.
        self._clock = 0

    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        k = self.num_speculative_tokens
        drafts: list[list[int]] = []
        states: dict[str, _RequestState] = {}
        for i, rid in enumerate(batch.request_ids):
            n = int(batch.num_tokens[i])
            history = batch.token_ids[i, :n]
            state = self._state.get(rid) or _RequestState()
            previous = len(state.draft)
            scored = previous if batch.num_verified is None else min(int(batch.num_verified[i]), previous)
            if scored and n > state.then:
                state.learn(history, scored)
            length, probe = state.next_length(k, self._clock)
            min_n = max(self.min_n, min(2, self.max_n)) if probe else self.min_n
            draft = propose_ngram(history, min_n, self.max_n, length).tolist() if length else []
            if probe and draft:
                state.probed()  # a lookup that found nothing was no probe
            state.draft, state.then = draft, n
            states[rid] = state
            drafts.append(draft)
        self._state = states
        self._clock += 1
        return drafts
