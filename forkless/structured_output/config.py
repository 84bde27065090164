"""``--structured-outputs-config``: vLLM's keys, checked where they are given.

Invariants:
    * Every key forkless reads is a field here; an unknown key is an error naming it and
      the known ones (nothing is accepted and ignored).
    * ``backend`` is ``auto``, a registered backend name or a ``pkg.mod:Class`` path;
      whether it resolves is checked when the engine is built, after general plugins
      have had their chance to register it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forkless.json_arg import json_config_arg

# vLLM's default: xgrammar where its check passes, else guidance (Lark grammars, what
# xgrammar's compiler refuses).
DEFAULT_BACKEND = "auto"


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """How constrained requests are compiled.

    Attributes:
        backend: ``auto`` (default, as vLLM's: xgrammar, else guidance for what xgrammar
            cannot do), ``xgrammar``, ``guidance`` (llguidance), another registered name,
            or a ``StructuredOutputBackend`` class path.
        disable_fallback: With ``auto``: refuse rather than fall back to guidance.
        disable_any_whitespace: Compact JSON for every request (no whitespace between
            tokens).
        disable_additional_properties: JSON objects get only their schema's properties.
        reasoning_parser: The reasoning parser's registered name (``--reasoning-parser``);
            ``""``: none, every constraint holds from the first token.
        reasoning_parser_plugin: A ``.py`` file or module to import before the parser is
            looked up (``--reasoning-parser-plugin``); ``""``: none.
        enable_in_reasoning: Constrain the reasoning too: the grammar holds from the
            first token even with a reasoning parser.
    """

    backend: str = DEFAULT_BACKEND
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    reasoning_parser: str = ""
    reasoning_parser_plugin: str = ""
    enable_in_reasoning: bool = False

    @classmethod
    def from_json(cls, value: str | dict[str, Any] | StructuredOutputsConfig | None) -> StructuredOutputsConfig:
        """Parse the flag's JSON (or a dict, as ``LLM(structured_outputs_config=...)`` takes).

        Raises:
            ValueError: Not a JSON object, an unknown key, or a value of the wrong type.
        """
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        value = json_config_arg(value, "--structured-outputs-config", cls)
        backend = value.get("backend", DEFAULT_BACKEND)
        if not isinstance(backend, str) or not backend:
            raise ValueError(f"--structured-outputs-config: backend={backend!r} is invalid: expected 'xgrammar', "
                             "'guidance', 'auto', another registered name or a class path")
        for name in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties",
                     "enable_in_reasoning"):
            if name in value and not isinstance(value[name], bool):
                raise ValueError(f"--structured-outputs-config: {name}={value[name]!r} is invalid: expected a bool")
        for name in ("reasoning_parser", "reasoning_parser_plugin"):
            if name in value and not isinstance(value[name], str):
                raise ValueError(f"--structured-outputs-config: {name}={value[name]!r} is invalid: expected a string")
        return cls(**value)
