"""The ``xgrammar`` backend (the default): XGrammar's compiler and matchers.

xgrammar (and with it torch) is imported only when the backend is built, in the engine
core; :meth:`XgrammarBackend.validate_params` runs in the API server without it.
Compiled grammars are cached by xgrammar's compiler, keyed on the constraint, so a
repeated schema costs a matcher, not a compilation.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from forkless.structured_output.interface import StructuredOutputBackend, StructuredOutputGrammar
from forkless.structured_output.validation import (
    describe,
    grammar_spec,
    is_lark,
    llguidance_problems,
    unenforceable_keywords,
)

if TYPE_CHECKING:
    import numpy as np

    from forkless.sampling_params import StructuredOutputsParams
    from forkless.structured_output.config import StructuredOutputsConfig

def choice_as_ebnf(choices: list[str]) -> str:
    """An EBNF grammar whose language is exactly ``choices``."""
    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


# Below this many rows a step fills them one by one (threads cost more than they save).
_BATCH_FILL_MIN = 16
# A step's rows go to xgrammar's threads only when one thread would take longer than
# this: most rows cost 1-3 us (the mask of a state is cached), and then waking the threads
# costs more than it saves (256 rows of a JSON schema over Qwen's vocabulary, 2-core Xeon:
# 0.42 ms on one thread, 0.50 on two; 1.8 ms on eight on an H200's 16-core host).
_PARALLEL_FILL_SECONDS = 1e-3
# One step in this many fills on one thread anyway, to keep its cost per row current.
_REMEASURE_EVERY = 64


class XgrammarGrammar(StructuredOutputGrammar):
    """A request's ``xgrammar.GrammarMatcher``."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        for token in tokens:
            if not self.matcher.accept_token(token):
                return False
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        accepted = 0
        for token in tokens:
            if not self.matcher.accept_token(token):
                break
            accepted += 1
        if accepted:
            self.matcher.rollback(accepted)
        return tokens[:accepted]

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    def fill_bitmask(self, bitmask: np.ndarray, index: int) -> None:
        import torch

        # A view of the same memory: xgrammar writes the row in place.
        self.matcher.fill_next_token_bitmask(torch.from_numpy(bitmask), index)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def reset(self) -> None:
        self.matcher.reset()


class XgrammarBackend(StructuredOutputBackend):
    """XGrammar: JSON schemas, regexes, choices and EBNF (GBNF) grammars."""

    name = "xgrammar"
    # A matcher terminates exactly when it accepts a stop token (terminated_batch).
    completion_from_tokens = True

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int],
                 config: StructuredOutputsConfig) -> None:
        super().__init__(tokenizer, vocab_size, eos_token_ids, config)
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=self.eos_token_ids or None)
        # Compilation runs on the engine core's compile threads; xgrammar's own threads
        # parallelise one compilation. Keep both small: the step loop shares the cores.
        threads = max(1, min(8, (os.cpu_count() or 2) // 2))
        self._compiler = xgr.GrammarCompiler(info, max_threads=min(threads, 4), cache_enabled=True,
                                             cache_limit_bytes=256 << 20)
        # Fills a step's rows in one call: on one thread, or on several when the rows are
        # costly (the step loop waits for it). _row_seconds: one thread's time per row,
        # as last measured.
        self._serial = xgr.BatchGrammarMatcher(max_threads=1)
        self._batch = xgr.BatchGrammarMatcher(max_threads=threads) if threads > 1 else self._serial
        self._row_seconds = 0.0
        self._fills = 0
        # A matcher terminates exactly when it accepts one of these (xgrammar's default,
        # terminate_without_stop_token=False): terminated_batch needs no call per grammar.
        self._stop_ids = frozenset(info.stop_token_ids)
        # xgrammar's batch advance without its result's conversion, which makes one FFI
        # call per element; each FFI call releases and takes the GIL again, which costs
        # little alone but up to a switch interval each while another thread holds it.
        # None where a later xgrammar moves it (then the public wrapper).
        core = getattr(getattr(xgr, "matcher", None), "_core", None)
        self._raw_accept = getattr(getattr(core, "BatchGrammarMatcher", None), "batch_accept_token", None)
        # A step's advance is one call on the calling thread: split over Python threads
        # it took longer (H200 host, 256 matchers of the benchmark's schema over Qwen's
        # vocabulary, median of 60 steps: 0.71 ms in one call, 0.83 / 1.03 / 1.53 ms in
        # 2 / 4 / 8 parts; benchmarks/README.md, "The grammar process").

    def fill_bitmasks(self, grammars: list[StructuredOutputGrammar], bitmask: np.ndarray,
                      indices: list[int]) -> None:
        if len(grammars) < _BATCH_FILL_MIN:
            super().fill_bitmasks(grammars, bitmask, indices)
            return
        import torch

        matchers = [g.matcher for g in grammars]  # type: ignore[attr-defined]
        self._fills += 1
        if (self._batch is self._serial or self._row_seconds * len(matchers) < _PARALLEL_FILL_SECONDS
                or self._fills % _REMEASURE_EVERY == 0):
            started = time.perf_counter()
            self._serial.batch_fill_next_token_bitmask(matchers, torch.from_numpy(bitmask), indices)
            self._row_seconds = (time.perf_counter() - started) / len(matchers)
        else:
            self._batch.batch_fill_next_token_bitmask(matchers, torch.from_numpy(bitmask), indices)

    def accept_tokens_batch(self, grammars: list[StructuredOutputGrammar], request_ids: list[str],
                            tokens: list[list[int]], *, background: bool = False) -> list[bool]:
        if len(grammars) < _BATCH_FILL_MIN or any(len(t) != 1 for t in tokens):
            return super().accept_tokens_batch(grammars, request_ids, tokens)
        # One token each (no drafts kept this step): advanced in one call.
        matchers = [g.matcher for g in grammars]  # type: ignore[attr-defined]
        firsts = [t[0] for t in tokens]
        if self._raw_accept is None:
            return list(self._batch.batch_accept_token(matchers, firsts))
        result = self._raw_accept([m._handle for m in matchers], firsts, False)
        # Every token accepted (the masked case), asked in an FFI call or two: the
        # elements are 0/1 integers, compared by type (False would not match 0).
        if 0 not in result and False not in result:
            return [True] * len(matchers)
        return [bool(ok) for ok in result]

    def stop_token_ids(self) -> list[int]:
        return sorted(self._stop_ids)

    def terminated_batch(self, grammars: list[StructuredOutputGrammar], tokens: list[list[int]]) -> list[bool]:
        stop = self._stop_ids
        return [bool(t) and t[-1] in stop for t in tokens]

    @classmethod
    def validate_params(cls, params: StructuredOutputsParams) -> None:
        from forkless.structured_output.config import StructuredOutputsConfig

        kind, spec, _ = grammar_spec(params, StructuredOutputsConfig())
        if kind == "json":
            keywords = unenforceable_keywords(json.loads(spec))
            if keywords:
                raise ValueError(f"the JSON schema uses {', '.join(keywords)}, which the xgrammar backend cannot "
                                 "enforce")
        if kind == "grammar" and is_lark(spec):
            raise ValueError("the xgrammar backend reads EBNF grammars (root ::= ...); this grammar has no '::=' "
                             "rule (Lark?): use the guidance backend or auto for Lark grammars")
        problems = llguidance_problems(kind, spec, strict=False)
        if problems:
            raise ValueError(f"invalid {describe(kind)}: {problems[0]}")

    def compile_grammar(self, request_type: str, spec: str, *, any_whitespace: bool = True) -> StructuredOutputGrammar:
        compiler = self._compiler
        try:
            if request_type == "json":
                compiled = compiler.compile_json_schema(spec, any_whitespace=any_whitespace)
            elif request_type == "json_object":
                compiled = compiler.compile_json_schema('{"type": "object"}', any_whitespace=any_whitespace)
            elif request_type == "regex":
                compiled = compiler.compile_regex(spec)
            elif request_type == "choice":
                compiled = compiler.compile_grammar(choice_as_ebnf(json.loads(spec)))
            elif request_type == "grammar":
                compiled = compiler.compile_grammar(spec)
            else:
                raise ValueError(f"unknown structured-output request type {request_type!r}")
        except RuntimeError as exc:
            # xgrammar prefixes its messages with a timestamp and a source location.
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"xgrammar cannot compile the {describe(request_type)}: "
                             f"{message.split(': ', 1)[-1]}") from None
        return XgrammarGrammar(self._xgr.GrammarMatcher(compiled))

    def destroy(self) -> None:
        self._compiler.clear_cache()
