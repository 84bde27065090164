"""The ``guidance`` backend: llguidance's matchers (JSON schemas, regexes, choices, Lark
and GBNF grammars).

llguidance has no torch dependency and builds its parser lazily, token by token, so a
"compilation" is cheap; a fresh matcher for a constraint seen before is a copy of a
cached one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from forkless.structured_output.interface import StructuredOutputBackend, StructuredOutputGrammar
from forkless.structured_output.validation import describe, grammar_spec, llguidance_grammar, llguidance_problems

if TYPE_CHECKING:
    import numpy as np

    from forkless.sampling_params import StructuredOutputsParams
    from forkless.structured_output.config import StructuredOutputsConfig

_CACHE_SIZE = 256


class GuidanceGrammar(StructuredOutputGrammar):
    """A request's ``llguidance.LLMatcher``."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return bool(self.matcher.consume_tokens(tokens)) and not self.matcher.is_error()

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return tokens[: self.matcher.validate_tokens(tokens)]

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    def fill_bitmask(self, bitmask: np.ndarray, index: int) -> None:
        row = bitmask[index]
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.size * row.itemsize)

    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()

    def reset(self) -> None:
        self.matcher.reset()


class GuidanceBackend(StructuredOutputBackend):
    """llguidance (``"backend": "guidance"``)."""

    name = "guidance"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int],
                 config: StructuredOutputsConfig) -> None:
        super().__init__(tokenizer, vocab_size, eos_token_ids, config)
        import llguidance.hf

        self._ll = llguidance
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                       eos_token=self.eos_token_ids or None)
        # Fresh matchers by (type, spec, whitespace), copied for each request.
        self._cache: OrderedDict[tuple[str, str, bool], Any] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def validate_params(cls, params: StructuredOutputsParams) -> None:
        from forkless.structured_output.config import StructuredOutputsConfig

        kind, spec, _ = grammar_spec(params, StructuredOutputsConfig())
        problems = llguidance_problems(kind, spec, strict=True)
        if problems:
            raise ValueError(f"invalid or unsupported {describe(kind)} (guidance backend): {problems[0]}")

    def compile_grammar(self, request_type: str, spec: str, *, any_whitespace: bool = True) -> StructuredOutputGrammar:
        key = (request_type, spec, any_whitespace)
        with self._lock:
            proto = self._cache.get(key)
            if proto is not None:
                self._cache.move_to_end(key)
        if proto is None:
            if request_type in ("json", "json_object"):
                schema = spec if request_type == "json" else '{"type": "object"}'
                grammar = self._ll.LLMatcher.grammar_from_json_schema(
                    schema, defaults={"whitespace_flexible": any_whitespace})
            else:
                try:
                    grammar = llguidance_grammar(request_type, spec)
                except ValueError as exc:
                    raise ValueError(f"llguidance cannot compile the {describe(request_type)}: {exc}") from None
            proto = self._ll.LLMatcher(self._tokenizer, grammar, log_level=0)
            if proto.is_error():
                raise ValueError(f"llguidance cannot compile the {describe(request_type)}: {proto.get_error()}")
            with self._lock:
                self._cache[key] = proto
                while len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        return GuidanceGrammar(proto.deep_copy())
