"""Speculative decoding in the worker: verify this step's drafts, propose the next ones.

A request the scheduler gave drafts runs its last known token and ``k`` drafts in one row
of the step (``ScheduledRequest.num_spec_tokens``); the target's logits at those ``k + 1``
positions go through the rejection sampler (``forkless.spec_decode.rejection_sampler``),
which returns the drafts the target agrees with and then one token of its own. After the
step's tokens are on the host, the proposer guesses the next drafts of every request it
may speculate for; they travel back to the scheduler in ``ModelRunnerOutput``.

Invariants:
    * Only requests whose next-token distribution is the model's own, scaled by the
      temperature and cut by top-k / top-p, speculate (:func:`speculates`): no min-p,
      penalties, logits processors (``thinking_token_budget`` included), logprobs or
      seed. The rejection sampler keeps exactly that distribution; the others decode a
      token a step, in the same batches.
      Structured outputs speculate too: their grammar's mask at each verified position
      (the engine core's bitmask has a row per position) cuts the target's logits there
      before verification, so the kept tokens are the constrained distribution's.
    * The verification is batched on the device; its tokens reach the host with the
      step's own sampled tokens, in the same copy wait.
    * A proposer's hidden states (``needs_hidden_states``) are each request's hidden state
      at its last computed position: for a verified row, the position of its last
      accepted draft (or of its last known token when none was), picked on the device.
"""

from __future__ import annotations

import operator
import reprlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from forkless.protocol.step import ScheduledRequest, SpecDecodeStats
from forkless.sampling_params import SAMPLING_EPS, SamplingParams
from forkless.spec_decode.interface import ProposalBatch, Proposer, ProposerError, StepRow
from forkless.spec_decode.rejection_sampler import PAD_TOKEN_ID, rejection_sample



def speculates(params: SamplingParams) -> bool:
    """Whether a request may take drafts (see the module's invariants)."""
    plain = params.temperature < SAMPLING_EPS or (not params.min_p and params.seed is None)
    return (plain and params.logprobs is None and params.repetition_penalty == 1.0
            and not params.presence_penalty and not params.frequency_penalty and not params.logit_bias
            and not params.allowed_token_ids and not params.bad_words and not params.bad_words_token_ids
            and not params.min_tokens and params.thinking_token_budget is None)


@dataclass
class Verification:
    """One step's verification, its results being copied to the host.

    Attributes:
        row_indices: The step's rows that had drafts, in row order.
        num_drafts: Each one's draft count.
        tokens: ``[len(row_indices), k + 1]`` emitted tokens (host copy).
        num_emitted: ``[len(row_indices)]`` (host copy).
        hidden: ``[len(row_indices), k + 1, hidden]`` the target's hidden states at the
            verified positions (device; what the logits came from), for proposers that
            read them.
    """

    row_indices: list[int]
    num_drafts: np.ndarray
    tokens: torch.Tensor
    num_emitted: torch.Tensor
    hidden: torch.Tensor | None = None

    def emitted(self) -> dict[int, list[int]]:
        """Row index -> its emitted tokens (once the copy is complete)."""
        tokens, counts = self.tokens.tolist(), self.num_emitted.tolist()
        return {i: row[:n] for i, row, n in zip(self.row_indices, tokens, counts)}

    def stats(self, k: int) -> SpecDecodeStats:
        accepted = self.num_emitted.numpy() - 1
        per_pos = [int((accepted > j).sum()) for j in range(k)]
        return SpecDecodeStats(num_drafts=len(self.row_indices), num_draft_tokens=int(self.num_drafts.sum()),
                               num_accepted_tokens=int(accepted.sum()), num_accepted_tokens_per_pos=per_pos)


def verify(rows: list[ScheduledRequest], params: list[SamplingParams], hidden: torch.Tensor,
           query_starts: torch.Tensor, compute_logits: Callable[[torch.Tensor], torch.Tensor],
           to_device: Callable[[np.ndarray], torch.Tensor],
           to_host: Callable[[torch.Tensor], torch.Tensor],
           mask: Callable[[torch.Tensor, list[int]], None] | None = None,
           sampled: torch.Tensor | None = None) -> tuple[Verification, torch.Tensor | None]:
    """Verify the drafts of this step's rows that have some.

    Args:
        rows: The step's rows, in batch order.
        params: Each row's sampling parameters.
        hidden: The model's output, one row per token of the step.
        query_starts: ``[len(rows) + 1]`` (host): where each row's tokens start in ``hidden``.
        compute_logits: The model's LM head.
        to_device: Host array -> device tensor.
        to_host: Queues a device -> host copy.
        mask: Structured outputs: masks, in place, the ``[rows with drafts, k + 1, V]``
            logits of the constrained rows among those (given as step row indexes) at
            each position with what their grammar allows there.
        sampled: Indexes into ``hidden`` of the positions the step samples from, whose
            logits are to come out of the same LM-head pass as the verified positions'
            (on the CPU, where the pass streams the whole LM head's weights, a second
            pass costs as much as the first); ``None``: the caller computes them.

    Returns:
        ``(verification, logits)``: the logits at ``sampled`` (``None`` without it).
    """
    idx = [i for i, s in enumerate(rows) if s.num_spec_tokens]
    num_drafts = np.array([rows[i].num_spec_tokens for i in idx], dtype=np.int64)
    k = int(num_drafts.max())
    # A row's last known token sits just before its drafts, at the end of the row.
    first = np.array([int(query_starts[i]) + len(rows[i].token_ids) - 1 - rows[i].num_spec_tokens for i in idx],
                     dtype=np.int64)
    # k + 1 positions per row; a row with fewer drafts repeats its last (never read).
    gather = np.minimum(first[:, None] + np.arange(k + 1)[None, :], (first + num_drafts)[:, None])
    scored = hidden[to_device(gather.reshape(-1))]
    step_logits = None
    if sampled is None:
        logits = compute_logits(scored).view(len(idx), k + 1, -1)
    else:
        both = compute_logits(torch.cat([hidden[sampled], scored]))
        step_logits, logits = both[: len(sampled)], both[len(sampled):].view(len(idx), k + 1, -1)
    if mask is not None:
        mask(logits, idx)
    drafts = np.full((len(idx), k), PAD_TOKEN_ID, dtype=np.int64)
    for j, i in enumerate(idx):
        drafts[j, : num_drafts[j]] = rows[i].token_ids[len(rows[i].token_ids) - num_drafts[j]:]
    temperature = np.array([params[i].temperature for i in idx], dtype=np.float32)
    temperature[temperature < SAMPLING_EPS] = 0.0
    vocab = logits.shape[-1]
    top_k = np.array([params[i].top_k if 0 < params[i].top_k < vocab else vocab for i in idx], dtype=np.int64)
    top_p = np.array([params[i].top_p for i in idx], dtype=np.float32)
    tokens, emitted = rejection_sample(
        to_device(drafts), to_device(num_drafts), logits, to_device(temperature),
        top_k=to_device(top_k) if (top_k < vocab).any() else None,
        top_p=to_device(top_p) if (top_p < 1.0).any() else None)
    return (Verification(idx, num_drafts, to_host(tokens), to_host(emitted), scored.view(len(idx), k + 1, -1)),
            step_logits)


def last_hidden_states(last_hidden: torch.Tensor, verification: Verification | None, rows: list[int],
                       to_device: Callable[[np.ndarray], torch.Tensor]) -> torch.Tensor:
    """Each of ``rows``' hidden state at its last computed position (see the invariants).

    Args:
        last_hidden: ``[num_rows, hidden]``: each row's hidden state at its last scheduled
            position (right for the rows without drafts).
        verification: The step's verification (its results on the host), or ``None``.
        rows: The step's row indexes wanted, in order.
        to_device: Host array -> device tensor.
    """
    if verification is not None and verification.hidden is not None:
        last_hidden = last_hidden.clone()
        emitted = verification.num_emitted.numpy().astype(np.int64)
        picked = verification.hidden[to_device(np.arange(len(emitted))), to_device(emitted - 1)]
        last_hidden[to_device(np.asarray(verification.row_indices, dtype=np.int64))] = picked
    return last_hidden[to_device(np.asarray(rows, dtype=np.int64))]


def propose(proposer: Proposer, histories: list[tuple[str, list[int], list[int]]], vocab_size: int,
            hidden_states: Any = None, step: list[StepRow] | None = None,
            num_verified: list[int] | None = None) -> dict[str, list[int]]:
    """The proposer's drafts for requests ``(id, prompt, output)``; only non-empty ones.

    ``hidden_states``, ``step`` and ``num_verified`` (per request, the drafts this step
    scored) go into the :class:`ProposalBatch`. With ``step``, the proposer runs even
    without requests to propose for: its cache must follow every step.

    Raises:
        ProposerError: The proposer raised, or returned anything but one sequence per
            request of token ids in ``[0, vocab_size)`` (each draft is cut to
            ``num_speculative_tokens``).
    """
    if not histories:
        if step:
            _call(proposer, ProposalBatch([], np.zeros((0, 0), dtype=np.int64), np.zeros(0, dtype=np.int64),
                                          step=step))
        return {}
    lengths = np.array([len(p) + len(o) for _, p, o in histories], dtype=np.int64)
    ids = np.zeros((len(histories), int(lengths.max())), dtype=np.int64)
    for row, (_, prompt, output) in enumerate(histories):
        ids[row, : len(prompt)] = prompt
        ids[row, len(prompt) : lengths[row]] = output
    verified = None if num_verified is None else np.array(num_verified, dtype=np.int64)
    batch = ProposalBatch([rid for rid, _, _ in histories], ids, lengths, hidden_states, step, verified)
    drafts = _call(proposer, batch)
    expected = f"one list of token ids in [0, {vocab_size}) per request ({len(histories)})"
    try:
        count = len(drafts)
    except TypeError:
        count = None
    if count != len(histories):
        raise ProposerError.naming(proposer, f"returned {reprlib.repr(drafts)}: expected {expected}")
    k = proposer.num_speculative_tokens
    checked = {}
    for (rid, _, _), draft in zip(histories, drafts):
        try:
            # operator.index: ints and integer scalars (numpy's, torch's), never a float or a string.
            tokens = [operator.index(t) for t in draft[:k]]
        except (TypeError, IndexError, KeyError):
            tokens = None
        if tokens is None or not all(0 <= t < vocab_size for t in tokens):
            raise ProposerError.naming(proposer, f"returned {reprlib.repr(draft)} for request {rid!r}: "
                                                 f"expected {expected}")
        if tokens:
            checked[rid] = tokens
    return checked


def _call(proposer: Proposer, batch: ProposalBatch) -> Any:
    """``proposer.propose(batch)``; what it raises becomes a :class:`ProposerError` naming it."""
    try:
        return proposer.propose(batch)
    except Exception as e:
        raise ProposerError.naming(proposer, f"raised {type(e).__name__}: {e}") from e


__all__ = ["Verification", "last_hidden_states", "propose", "speculates", "verify"]
