"""Speculative decoding: proposers guess tokens, the target verifies them in one pass.

Public names (provisional tier): :class:`Proposer` (subclass it for a proposer),
:class:`ProposerRegistry` (``register(name, "pkg.mod:Class")`` from a general plugin),
:class:`ProposalBatch`, :class:`StepRow`, :class:`SpeculativeConfig`, :class:`ProposerError`
(what a step fails with when a proposer raises or returns bad drafts). Built-in: ``ngram``
and ``draft_model`` (``forkless.worker.draft_model``: a smaller model with its own paged
KV cache in the worker). A proposer may ask for the target's last hidden states
(``Proposer.needs_hidden_states``).

The engine runs them with ``--speculative-config`` (``forkless/worker/speculation.py``
verifies and proposes in the worker; the scheduler schedules drafts after a request's
last token and rolls back the rejected ones). With ``--async-scheduling``, a step in which
drafts wait to be verified is planned after the step before it is collected (the
positions of a request's next tokens depend on how many drafts were kept); steps without
drafts overlap as usual.
"""

from __future__ import annotations

from forkless.spec_decode.config import SpeculativeConfig
from forkless.spec_decode.interface import ProposalBatch, Proposer, ProposerError, StepRow
from forkless.spec_decode.registry import ProposerRegistry

__all__ = ["ProposalBatch", "Proposer", "ProposerError", "ProposerRegistry", "SpeculativeConfig", "StepRow"]
