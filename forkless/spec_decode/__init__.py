"""Speculative decoding: proposers guess tokens, the target verifies them in one pass.

Public names (provisional tier): :class:`Proposer` (subclass it for a proposer),
:class:`ProposerRegistry` (``register(name, "pkg.mod:Class")`` from a general plugin),
:class:`ProposalBatch`, :class:`SpeculativeConfig`. Built-in: ``ngram``.

The engine runs them with ``--speculative-config`` (``forkless/worker/speculation.py``
verifies and proposes in the worker; the scheduler schedules drafts after a request's
last token and rolls back the rejected ones). Not built yet: ``draft_model``, proposers
that read the target's hidden states, verification under CUDA graphs and with
``--async-scheduling`` (refused with it).
"""

from __future__ import annotations

from forkless.spec_decode.config import SpeculativeConfig
from forkless.spec_decode.interface import ProposalBatch, Proposer
from forkless.spec_decode.registry import ProposerRegistry

__all__ = ["ProposalBatch", "Proposer", "ProposerRegistry", "SpeculativeConfig"]
