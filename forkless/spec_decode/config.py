"""``--speculative-config``: vLLM's keys, checked where they are given.

Invariants:
    * Every key of vLLM's JSON that forkless reads is a field here; an unknown key is an
      error naming it and the known ones (nothing is accepted and ignored).
    * ``method`` is a registered proposer name or a ``pkg.mod:Class`` path; whether it
      resolves is checked by :class:`~forkless.spec_decode.registry.ProposerRegistry`
      when the engine is built, so that a general plugin may register it first.
    * ``method`` may be left out when ``model`` is given (``draft_model``), as in vLLM;
      ``"[ngram]"``-style names are not vLLM 0.33's and are not accepted.
    * A draft model is checked against the target (:func:`check_draft_model`) when the
      engine is built, before any weight loads: same vocabulary size, and the same tokens
      where both folders hold a ``tokenizer.json``. Only JSON is read here (no torch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from forkless.json_arg import json_object_arg


#: ``ngram``'s ``prompt_lookup_min`` and ``prompt_lookup_max`` when neither is given (vLLM's).
DEFAULT_PROMPT_LOOKUP = 5


@dataclass(frozen=True)
class SpeculativeConfig:
    """What to speculate with (``--speculative-config`` / ``LLM(speculative_config=)``).

    ``{"method": "ngram", "num_speculative_tokens": 4}`` guesses from each request's own
    tokens (prompt lookup); ``{"method": "draft_model", "model": PATH,
    "num_speculative_tokens": 4}`` (``method`` may be left out when ``model`` is given)
    runs a smaller model of the target's tokenizer in the same worker, with its own paged
    KV cache (its blocks are the target's block ids; its memory comes out of the KV
    budget), ``k`` greedy steps after every target step; any other ``method`` is a
    registered proposer or a class path. Whatever proposes, the target verifies, so the
    output is what plain decoding gives.

    Attributes:
        method: The proposer: ``"ngram"``, ``"draft_model"``, another registered name,
            or a class path.
        num_speculative_tokens: Draft tokens per request per step (k, >= 1).
        prompt_lookup_min: ``ngram``: the shortest suffix of a request's tokens looked up
            in its history (>= 1; as vLLM: ``prompt_lookup_max`` when only that is given,
            5 when neither is).
        prompt_lookup_max: ``ngram``: the longest (>= ``prompt_lookup_min``; defaults
            likewise).
        model: ``draft_model``: the draft model's folder (same tokenizer as the target:
            same vocabulary size and tokens, else the engine refuses to start).
        draft_tensor_parallel_size: vLLM's key; only 1 is supported (the draft runs on
            the worker's device), any other value is refused.
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
                             f"{self.draft_tensor_parallel_size!r} is not supported: the draft model runs "
                             "on each worker's own device, so only 1 is")

    @classmethod
    def from_json(cls, value: "str | dict[str, Any] | SpeculativeConfig") -> "SpeculativeConfig":
        """Parse ``--speculative-config`` (a JSON object) or ``LLM(speculative_config=...)``.

        Raises:
            ValueError: Not a JSON object, an unknown key, or a bad value (named).
        """
        if isinstance(value, SpeculativeConfig):
            return value
        value = json_object_arg(value, "--speculative-config")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"speculative config: unknown key(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(known)}")
        data = dict(value)
        if "method" not in data and data.get("model") in ("ngram", "[ngram]"):
            data["method"] = "ngram"  # vLLM's spelling: the "model" names the method
            del data["model"]
        elif "method" not in data and data.get("model"):
            data["method"] = "draft_model"  # vLLM: a draft model without a method
        if "method" not in data:
            raise ValueError("speculative config: 'method' is required (e.g. \"ngram\" or \"draft_model\")")
        if "num_speculative_tokens" not in data:
            raise ValueError("speculative config: 'num_speculative_tokens' is required")
        return cls(**data)


def _vocab_size(config: dict[str, Any]) -> int | None:
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if size else None


def _tokens(folder: Path) -> dict[int, str] | None:
    """Token id -> token of a folder's ``tokenizer.json`` (vocabulary and added tokens)."""
    path = folder / "tokenizer.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = (data.get("model") or {}).get("vocab")
    tokens: dict[int, str] = {}
    if isinstance(vocab, dict):
        tokens.update((int(i), t) for t, i in vocab.items())
    elif isinstance(vocab, list):  # unigram: [token, score] pairs, the id is the index
        tokens.update((i, entry[0]) for i, entry in enumerate(vocab))
    for added in data.get("added_tokens") or ():
        tokens[int(added["id"])] = added["content"]
    return tokens


def check_draft_model(target: str | Path, draft: str | Path) -> Path:
    """Check that ``draft`` is a model folder whose token ids mean the target's tokens.

    Args:
        target: The target model's folder.
        draft: The ``model`` of ``--speculative-config``.

    Returns:
        The draft's folder.

    Raises:
        ValueError: Not a model folder, another vocabulary size, or another tokenizer;
            the message names both models and what differs.
    """
    folder = Path(draft).expanduser()
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ValueError(f"speculative config: the draft 'model' {str(draft)!r} is not a model folder "
                         f"(no {config_path}); give the folder of a model that uses the target's tokenizer")
    target = Path(target)
    target_vocab = _vocab_size(json.loads((target / "config.json").read_text(encoding="utf-8")))
    draft_vocab = _vocab_size(json.loads(config_path.read_text(encoding="utf-8")))
    if target_vocab != draft_vocab:
        raise ValueError(f"speculative config: the draft model {str(draft)!r} has a vocabulary of {draft_vocab} "
                         f"tokens and the target {str(target)!r} of {target_vocab}: a draft model must use the "
                         "target's tokenizer")
    ours, theirs = _tokens(target), _tokens(folder)
    if ours is not None and theirs is not None and ours != theirs:
        differ = sorted(i for i in set(ours) | set(theirs) if ours.get(i) != theirs.get(i))
        i = differ[0]
        raise ValueError(f"speculative config: the draft model {str(draft)!r} has another tokenizer than the "
                         f"target {str(target)!r}: {len(differ)} token ids differ (id {i} is "
                         f"{theirs.get(i)!r} in the draft, {ours.get(i)!r} in the target)")
    return folder
