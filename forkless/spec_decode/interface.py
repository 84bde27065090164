"""The speculative proposer interface (provisional tier).

A proposer guesses the next tokens of running requests; the target model then scores
the guesses and the rejection sampler keeps the prefix it agrees with (vLLM's v1
design: the proposer runs in the worker, after the step's tokens are known, and its
drafts are verified in the next step).

Invariants:
    * ``propose`` gets every speculating request's whole token history (prompt + output,
      the token just sampled included) and returns, per request, between 0 and
      ``num_speculative_tokens`` draft tokens. An empty list means "no guess": that
      request decodes one token as without speculation.
    * A proposer that wants the target's last hidden states says so with
      :attr:`Proposer.needs_hidden_states`; only then are they gathered for it. Row ``i``
      is the hidden state (after the final norm, the LM head's input) at request ``i``'s
      last computed position, the one whose logits gave its newest token.
    * A proposer that runs a model of its own over the requests' tokens says so with
      :attr:`Proposer.uses_kv_cache`: the worker then sizes the KV cache for it
      (:meth:`Proposer.kv_bytes_per_block`, :meth:`Proposer.kv_reserved_bytes`), calls
      :meth:`Proposer.initialize_cache` with the block count, and gives every step's rows
      to :meth:`Proposer.propose` (``ProposalBatch.step``), speculating or not, so that its
      cache holds what the target's holds, block for block.
    * Proposals never change what the user gets: a wrong guess costs time, not output
      (the verification keeps exactly the tokens the target itself produces).
    * A proposer that raises, or returns anything but one sequence per request of token
      ids in ``[0, vocab_size)``, fails the step with a :class:`ProposerError` naming it
      (``forkless.worker.speculation.propose`` checks every draft).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    import numpy as np

    from forkless.spec_decode.config import SpeculativeConfig



@dataclass
class StepRow:
    """One request's tokens that a step made known, for a proposer with ``uses_kv_cache``.

    Attributes:
        request_id: The request.
        start_position: The position of ``token_ids[0]``.
        token_ids: Tokens at ``start_position`` onwards that the target computed this step
            (a prompt chunk, a decoded token, the accepted drafts), followed, for a
            request of the batch (``ProposalBatch.request_ids``), by the tokens it emitted
            this step. Rejected drafts are not in it.
        block_ids: The request's KV-cache block ids, in order (the target's table: the
            proposer's own cache uses the same ids).
        speculates: Whether the request may take drafts at all (its sampling parameters
            allow it); one that may not is only ever in the batch as a row of the step.
    """

    request_id: str
    start_position: int
    token_ids: list[int]
    block_ids: "np.ndarray"
    speculates: bool = True


@dataclass
class ProposalBatch:
    """The speculating requests of one step, for :meth:`Proposer.propose`.

    Attributes:
        request_ids: The requests, in batch order.
        token_ids: ``[len(request_ids), width]`` int64: row ``i`` holds request ``i``'s
            prompt and output tokens in its first ``num_tokens[i]`` columns (the rest is
            padding, never read).
        num_tokens: ``[len(request_ids)]`` int64: each row's token count.
        hidden_states: ``[len(request_ids), hidden]`` (a device tensor): the target's
            last hidden state per request, only for a proposer with
            ``needs_hidden_states``; else ``None``.
        step: Every row of the step (:class:`StepRow`), the batch's requests among them,
            only for a proposer with ``uses_kv_cache``; else ``None``.
        num_verified: ``[len(request_ids)]`` int64: how many of each request's previous
            drafts this step scored (the rest were never scored: the step had no room for
            them, or, with async scheduling, ran before they were known; 0 for all of
            them). ``None`` when not known: then every draft counts as scored.
    """

    request_ids: list[str]
    token_ids: "np.ndarray"
    num_tokens: "np.ndarray"
    hidden_states: Any = None
    step: "list[StepRow] | None" = None
    num_verified: "np.ndarray | None" = None


@stability(Stability.PROVISIONAL)
class Proposer(abc.ABC):
    """Base class of speculative proposers (``--speculative-config '{"method": ...}'``).

    Args:
        config: The speculative configuration (``num_speculative_tokens`` and the
            method's own keys).
        **kwargs: What the worker passes besides: ``device``, ``dtype`` (the target's),
            ``target_model`` (the target, e.g. for its ``compute_logits``), ``runner``
            (the worker's model runner: its engine config, attention backend and KV
            cache dtype). A proposer takes what it needs and ignores the rest.
    """

    #: Whether :meth:`propose` needs ``ProposalBatch.hidden_states``.
    needs_hidden_states: ClassVar[bool] = False
    #: Whether the proposer keeps a paged KV cache of its own in step with the target's
    #: (see the module's invariants); :meth:`propose` then gets ``ProposalBatch.step``.
    uses_kv_cache: ClassVar[bool] = False

    def __init__(self, config: "SpeculativeConfig", **kwargs: Any) -> None:
        self.config = config
        self.num_speculative_tokens = config.num_speculative_tokens

    @abc.abstractmethod
    def propose(self, batch: ProposalBatch) -> list[list[int]]:
        """Draft tokens for each request of ``batch``.

        Returns:
            One list per request, in batch order, of at most ``num_speculative_tokens``
            token ids (possibly empty).
        """

    def kv_bytes_per_block(self) -> int:
        """Bytes of the proposer's own KV cache per block of the target's (``uses_kv_cache``);
        the worker divides its KV budget by the sum of both."""
        return 0

    def kv_reserved_bytes(self) -> int:
        """Bytes besides (scratch space), taken from the KV budget before it is divided."""
        return 0

    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate the proposer's cache for ``num_blocks`` blocks (``uses_kv_cache``)."""


class ProposerError(RuntimeError):
    """A proposer raised in ``propose``, or returned drafts the target cannot verify; the
    message names the proposer's class, so that the engine's last words name the plugin
    rather than an error deep in the verification."""

    @classmethod
    def naming(cls, proposer: Proposer, problem: str) -> ProposerError:
        """The error for ``proposer``'s ``propose`` and what went wrong (``problem``)."""
        kind = type(proposer)
        return cls(f"speculative proposer {kind.__module__}.{kind.__qualname__}: propose() {problem}")
