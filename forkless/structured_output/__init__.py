"""Structured outputs: constrain generation to a JSON schema, regex, choice or grammar.

Public names (provisional tier): :class:`StructuredOutputBackend` and
:class:`StructuredOutputGrammar` (subclass them for a backend),
:data:`StructuredOutputBackendRegistry` (``register(name, "pkg.mod:Class")`` from a
general plugin), :class:`StructuredOutputsConfig` (``--structured-outputs-config``).
Built-ins: ``xgrammar`` (default) and ``guidance`` (llguidance); ``auto`` picks.

Where the pieces run (docs/architecture.md): the API server checks each constraint
(:func:`choose_backend`, torch-free); the engine core compiles grammars on its own
threads and fills one packed bitmask per step (:mod:`.manager`); the worker applies it
to the logits in one batched operation (:mod:`.bitmask`).
"""

from __future__ import annotations

from forkless.structured_output.config import StructuredOutputsConfig
from forkless.structured_output.interface import StructuredOutputBackend, StructuredOutputGrammar
from forkless.structured_output.registry import StructuredOutputBackendRegistry, choose_backend

__all__ = ["StructuredOutputBackend", "StructuredOutputBackendRegistry", "StructuredOutputGrammar",
           "StructuredOutputsConfig", "choose_backend"]
