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
    """A request's ``llguidance.LLMatcher``.

    Complete once it has taken a stop token, as vLLM's guidance grammar and xgrammar's
    are: a matcher that stops because nothing can extend its text (a JSON object's
    closing brace) allows only the stop tokens next, and taking one then completes it
    without feeding the matcher (which refuses anything after such a stop). Those stop
    tokens are counted (``_after_stop``) so that :meth:`rollback` undoes them first: a
    speculative draft may be one.
    """

    def __init__(self, matcher: Any, stop_token_ids: frozenset[int]) -> None:
        self.matcher = matcher
        self._stop_ids = stop_token_ids
        self._after_stop = 0

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        matcher = self.matcher
        # Up to the first stop token, the matcher takes them in one call (a step's usual
        # case: no stop token at all); a stop token after its own stop it may not take.
        cut = next((i for i, t in enumerate(tokens) if t in self._stop_ids), len(tokens))
        if cut and (matcher.is_stopped() or not matcher.consume_tokens(tokens[:cut]) or matcher.is_error()):
            return False
        rest = tokens[cut:]
        if not rest:
            return True
        if matcher.is_stopped():
            return self._accept_after_stop(rest)
        return bool(matcher.consume_tokens(rest)) and not matcher.is_error()

    def _accept_after_stop(self, tokens: list[int]) -> bool:
        if not all(t in self._stop_ids for t in tokens):
            return False
        self._after_stop += len(tokens)
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        n = 0 if self.matcher.is_stopped() else self.matcher.validate_tokens(tokens)
        # A stop token right after the matcher's own stop is what its mask allows there.
        if n < len(tokens) and tokens[n] in self._stop_ids and self._stops_after(tokens[:n]):
            n += 1
        return tokens[:n]

    def _stops_after(self, tokens: list[int]) -> bool:
        """Whether the matcher stops once it takes ``tokens`` (which it accepts)."""
        matcher = self.matcher
        if not tokens or matcher.is_stopped():
            return matcher.is_stopped()
        matcher.consume_tokens(tokens)
        stopped = matcher.is_stopped()
        matcher.rollback(len(tokens))
        return stopped

    def rollback(self, num_tokens: int) -> None:
        undone = min(num_tokens, self._after_stop)
        self._after_stop -= undone
        if num_tokens > undone:
            self.matcher.rollback(num_tokens - undone)

    def fill_bitmask(self, bitmask: np.ndarray, index: int) -> None:
        row = bitmask[index]
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.size * row.itemsize)

    def is_terminated(self) -> bool:
        return self._after_stop > 0 or self.matcher.stop_reason() == "EndOfSentence"

    def reset(self) -> None:
        self.matcher.reset()
        self._after_stop = 0


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
        return GuidanceGrammar(proto.deep_copy(), frozenset(self.eos_token_ids))
