"""A structured-output backend of its own: ``choice`` constraints as a trie of the
choices' token sequences (each choice as the tokenizer spells it)."""

from __future__ import annotations

import json
import time

import numpy as np

from forkless.structured_output import StructuredOutputBackend, StructuredOutputGrammar


class ChoiceTrieGrammar(StructuredOutputGrammar):
    def __init__(self, sequences: list[list[int]], eos: list[int]) -> None:
        self.sequences = sequences
        self.eos = eos
        self.tokens: list[int] = []
        self.done = False

    def _allowed(self) -> set[int]:
        n = len(self.tokens)
        allowed = {s[n] for s in self.sequences if len(s) > n and s[:n] == self.tokens}
        if self.tokens in self.sequences:
            allowed.update(self.eos)
        return allowed

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        for token in tokens:
            if self.done or token not in self._allowed():
                return False
            if token in self.eos and self.tokens in self.sequences:
                self.done = True
            else:
                self.tokens.append(token)
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        saved = (list(self.tokens), self.done)
        ok = []
        for token in tokens:
            if not self.accept_tokens("", [token]):
                break
            ok.append(token)
        self.tokens, self.done = saved
        return ok

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self.done:
            self.done = False
            num_tokens -= 1
        del self.tokens[len(self.tokens) - num_tokens:]

    def fill_bitmask(self, bitmask: np.ndarray, index: int) -> None:
        row = bitmask[index].view(np.uint32)
        row[:] = 0
        for token in self._allowed():
            row[token >> 5] |= np.uint32(1 << (token & 31))

    def is_terminated(self) -> bool:
        return self.done

    def reset(self) -> None:
        self.tokens, self.done = [], False


class ChoiceTrieBackend(StructuredOutputBackend):
    name = "choice_trie"

    @classmethod
    def validate_params(cls, params) -> None:
        if params.kind != "choice":
            raise ValueError(f"the choice_trie backend compiles only choice constraints, not {params.kind}")
        if params.choice[0] == "slow to check":
            # A check that takes a while, as llguidance's of 50,000 choices (the GIL released).
            time.sleep(1.5)

    def compile_grammar(self, request_type: str, spec: str, *, any_whitespace: bool = True) -> StructuredOutputGrammar:
        choices = json.loads(spec)
        return ChoiceTrieGrammar([self.tokenizer.encode(c, add_special_tokens=False) for c in choices],
                                 self.eos_token_ids)
