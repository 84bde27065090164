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
      :attr:`Proposer.needs_hidden_states`; only then are they gathered for it.
    * Proposals never change what the user gets: a wrong guess costs time, not output
      (the verification keeps exactly the tokens the target itself produces).
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
class ProposalBatch:
    """The speculating requests of one step, for :meth:`Proposer.propose`.

    Attributes:
        request_ids: The requests, in batch order.
        token_ids: ``[len(request_ids), width]`` int64: row ``i`` holds request ``i``'s
            prompt and output tokens in its first ``num_tokens[i]`` columns (the rest is
            padding, never read).
        num_tokens: ``[len(request_ids)]`` int64: each row's token count.
        hidden_states: ``[len(request_ids), hidden]``: the target's last hidden state per
            request, only for a proposer with ``needs_hidden_states``; else ``None``.
    """

    request_ids: list[str]
    token_ids: "np.ndarray"
    num_tokens: "np.ndarray"
    hidden_states: Any = None


@stability(Stability.PROVISIONAL)
class Proposer(abc.ABC):
    """Base class of speculative proposers (``--speculative-config '{"method": ...}'``).

    Args:
        config: The speculative configuration (``num_speculative_tokens`` and the
            method's own keys).
        **kwargs: What the worker passes besides (the device, the target's dtype); a
            proposer takes what it needs and ignores the rest.
    """

    #: Whether :meth:`propose` needs ``ProposalBatch.hidden_states``.
    needs_hidden_states: ClassVar[bool] = False

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
