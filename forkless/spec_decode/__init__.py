"""Speculative decoding: proposers guess tokens, the target verifies them in one pass.

Public names (provisional tier): :class:`Proposer` (subclass it for a proposer),
:class:`ProposerRegistry` (``register(name, "pkg.mod:Class")`` from a general plugin),
:class:`ProposalBatch`, :class:`SpeculativeConfig`. Built-in: ``ngram``.

Status: the proposer interface, the registry, ``ngram``, the configuration and the
rejection sampler exist and are tested on their own; the engine does not run them yet
(``--speculative-config`` is not a flag yet), nor is ``draft_model`` built.
"""

from __future__ import annotations

from forkless.spec_decode.config import SpeculativeConfig
from forkless.spec_decode.interface import ProposalBatch, Proposer
from forkless.spec_decode.registry import ProposerRegistry

__all__ = ["ProposalBatch", "Proposer", "ProposerRegistry", "SpeculativeConfig"]
