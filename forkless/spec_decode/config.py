"""``--speculative-config``: vLLM's keys, checked where they are given.

Invariants:
    * Every key of vLLM's JSON that forkless reads is a field here; an unknown key is an
      error naming it and the known ones (nothing is accepted and ignored).
    * ``method`` is a registered proposer name or a ``pkg.mod:Class`` path; whether it
      resolves is checked by :class:`~forkless.spec_decode.registry.ProposerRegistry`
      when the engine is built, so that a general plugin may register it first.
    * ``method`` may be left out when ``model`` is given (``draft_model``), as in vLLM;
      ``"[ngram]"``-style names are not vLLM 0.33's and are not accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any


#: ``ngram``'s ``prompt_lookup_min`` and ``prompt_lookup_max`` when neither is given (vLLM's).
DEFAULT_PROMPT_LOOKUP = 5


@dataclass(frozen=True)
class SpeculativeConfig:
    """What to speculate with.

    Attributes:
        method: The proposer: ``"ngram"``, ``"draft_model"``, another registered name,
            or a class path.
        num_speculative_tokens: Draft tokens per request per step (k, >= 1).
        prompt_lookup_min: ``ngram``: the shortest suffix of a request's tokens looked up
            in its history (>= 1; as vLLM: ``prompt_lookup_max`` when only that is given,
            5 when neither is).
        prompt_lookup_max: ``ngram``: the longest (>= ``prompt_lookup_min``; defaults
            likewise).
        model: ``draft_model``: the draft model's folder (same tokenizer as the target).
        draft_tensor_parallel_size: vLLM's key; only 1 is supported.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None
    draft_tensor_parallel_size: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise ValueError(f"speculative config: 'method' must be a proposer name or class path, "
                             f"got {self.method!r}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"speculative config: 'num_speculative_tokens' must be an integer >= 1, got {k!r}")
        if self.method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
                if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                    raise ValueError(f"speculative config: {name!r} must be an integer >= 1, got {value!r}")
            # vLLM's rules: neither given means both are 5; one given means both are it.
            if lo is None and hi is None:
                lo = hi = DEFAULT_PROMPT_LOOKUP
            lo = hi if lo is None else lo
            hi = lo if hi is None else hi
            if lo > hi:
                raise ValueError(f"speculative config: 'prompt_lookup_min' ({lo}) is larger than "
                                 f"'prompt_lookup_max' ({hi})")
            object.__setattr__(self, "prompt_lookup_min", lo)
            object.__setattr__(self, "prompt_lookup_max", hi)
        if self.method == "draft_model" and not self.model:
            raise ValueError("speculative config: method 'draft_model' needs 'model' (the draft model's folder)")
        if self.draft_tensor_parallel_size not in (None, 1):
            raise ValueError(f"speculative config: 'draft_tensor_parallel_size' "
                             f"{self.draft_tensor_parallel_size!r} is not supported (only 1)")

    @classmethod
    def from_json(cls, value: "str | dict[str, Any] | SpeculativeConfig") -> "SpeculativeConfig":
        """Parse ``--speculative-config`` (a JSON object) or ``LLM(speculative_config=...)``.

        Raises:
            ValueError: Not a JSON object, an unknown key, or a bad value (named).
        """
        if isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"--speculative-config is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative config must be a JSON object, got {type(value).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"speculative config: unknown key(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(known)}")
        data = dict(value)
        if "method" not in data and data.get("model"):
            data["method"] = "draft_model"  # vLLM: a draft model without a method
        if "method" not in data:
            raise ValueError("speculative config: 'method' is required (e.g. \"ngram\" or \"draft_model\")")
        if "num_speculative_tokens" not in data:
            raise ValueError("speculative config: 'num_speculative_tokens' is required")
        return cls(**data)
