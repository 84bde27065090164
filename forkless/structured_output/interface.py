"""The structured-output backend interface (provisional tier).

A backend turns a request's constraint (a JSON schema, a regex, a list of choices, a
grammar) into a :class:`StructuredOutputGrammar`: a matcher that knows, after the tokens
generated so far, which tokens may come next. The engine core keeps one grammar per
constrained request, fills one packed bitmask per step from them, and advances each
grammar with the tokens the worker sampled (vLLM's v1 design).

Invariants:
    * Grammars live in the engine core only; the worker sees a bitmask, never a grammar.
    * A bitmask row has ``ceil(vocab_size / 32)`` int32 words; bit ``t % 32`` of word
      ``t // 32`` set means token ``t`` is allowed. ``vocab_size`` is the width of the
      model's logits (which may exceed the tokenizer's vocabulary: those ids are never
      allowed).
    * ``compile_grammar`` runs on the engine core's compile threads, never on the step
      loop; it may be slow, and may run for several requests at once (a backend must be
      safe to call from several threads). Every other method runs on the step loop and
      must be fast.
    * ``validate_params`` runs in the API server (and offline before a request is
      queued): it must not import torch or need a tokenizer, and raises ``ValueError``
      naming the problem for a constraint the backend cannot compile.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    import numpy as np

    from forkless.sampling_params import StructuredOutputsParams
    from forkless.structured_output.config import StructuredOutputsConfig

#: The constraint kinds ``compile_grammar`` receives (``StructuredOutputsParams.kind``).
REQUEST_TYPES = ("json", "json_object", "regex", "choice", "grammar")


@stability(Stability.PROVISIONAL)
class StructuredOutputGrammar(abc.ABC):
    """One request's matcher: where it is in the grammar after the tokens so far."""

    @abc.abstractmethod
    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Advance over sampled tokens.

        Args:
            request_id: The request (for log messages).
            tokens: Tokens generated, in order.

        Returns:
            Whether all of them were accepted (``False``: the grammar stays after the
            last accepted one).
        """

    @abc.abstractmethod
    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """The longest prefix of ``tokens`` the grammar accepts, without advancing
        (speculative drafts are checked with it)."""

    @abc.abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""

    @abc.abstractmethod
    def fill_bitmask(self, bitmask: np.ndarray, index: int) -> None:
        """Write the allowed next tokens into row ``index`` of ``bitmask``.

        Args:
            bitmask: An array from :meth:`StructuredOutputBackend.allocate_token_bitmask`.
            index: The row to fill.
        """

    @abc.abstractmethod
    def is_terminated(self) -> bool:
        """Whether the grammar is complete (its stop token accepted): nothing may follow."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Back to the start, as freshly compiled."""


@stability(Stability.PROVISIONAL)
class StructuredOutputBackend(abc.ABC):
    """Compiles constraints into grammars (``--structured-outputs-config '{"backend": ...}'``).

    Args:
        tokenizer: The model's Hugging Face tokenizer.
        vocab_size: Width of the model's logits (bitmask rows cover this many tokens).
        eos_token_ids: The model's EOS ids: a complete grammar allows only these.
        config: The server's structured-output settings.

    Attributes:
        name: The name it is registered under (for messages).
        supports_speculative_validation: ``validate_tokens`` and ``rollback`` work, so
            drafts could be checked against the grammar. forkless does not speculate for
            constrained requests yet, whatever this says.
        completion_from_tokens: :meth:`terminated_batch` answers from the tokens alone
            (whether a request's last token is one of :meth:`stop_token_ids`), before the
            grammars are advanced over them. The engine
            core may then advance them later, off its step loop, together with the next
            bitmask's fill (under ``--async-scheduling``), calling
            :meth:`accept_tokens_batch` with ``background=True``; ``False`` (the
            default): they are advanced on the step loop, before completion is asked.
    """

    name: ClassVar[str] = ""
    supports_speculative_validation: ClassVar[bool] = True
    completion_from_tokens: ClassVar[bool] = False

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int],
                 config: StructuredOutputsConfig) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.config = config

    @classmethod
    def validate_params(cls, params: StructuredOutputsParams) -> None:
        """Refuse a constraint this backend cannot compile (torch-free; see the module).

        The default accepts everything (compilation errors then fail the request in the
        engine core). The answer is remembered for the same params (``choose_backend``):
        it must depend on them alone.

        Raises:
            ValueError: The message names the problem.
        """

    @abc.abstractmethod
    def compile_grammar(self, request_type: str, spec: str, *, any_whitespace: bool = True) -> StructuredOutputGrammar:
        """Compile a constraint into a fresh grammar (called on a compile thread).

        Args:
            request_type: One of :data:`REQUEST_TYPES`.
            spec: ``json``: the schema's JSON text; ``choice``: the JSON list of choices;
                ``regex`` / ``grammar``: the text; ``json_object``: ignored.
            any_whitespace: Allow any whitespace between JSON tokens (``False``: compact).

        Raises:
            ValueError: The constraint does not compile; the message says why.
        """

    def fill_bitmasks(self, grammars: list[StructuredOutputGrammar], bitmask: np.ndarray,
                      indices: list[int]) -> None:
        """Fill the rows ``indices`` of ``bitmask`` from ``grammars`` (this backend's), in
        one call per step. The default asks each grammar in turn; a backend that can
        fill many rows at once (on several threads) overrides it."""
        for grammar, index in zip(grammars, indices):
            grammar.fill_bitmask(bitmask, index)

    def accept_tokens_batch(self, grammars: list[StructuredOutputGrammar], request_ids: list[str],
                            tokens: list[list[int]], *, background: bool = False) -> list[bool]:
        """Advance ``grammars`` (this backend's) over a step's tokens, in one call per
        step; each result is :meth:`StructuredOutputGrammar.accept_tokens`'s. The default
        asks each grammar in turn; a backend that can advance many at once overrides it.

        ``background``: called off the step loop, which goes on meanwhile (see
        :attr:`completion_from_tokens`): spreading the work over more Python threads
        would take the interpreter's lock from the step loop more often than it saves."""
        return [g.accept_tokens(rid, t) for g, rid, t in zip(grammars, request_ids, tokens)]

    def terminated_batch(self, grammars: list[StructuredOutputGrammar], tokens: list[list[int]]) -> list[bool]:
        """Which of ``grammars`` (this backend's), just advanced over ``tokens`` by
        :meth:`accept_tokens_batch` and all of them accepted, are now complete
        (:meth:`StructuredOutputGrammar.is_terminated`). The default asks each grammar; a
        backend that can tell from the tokens alone (its stop tokens) overrides it, and
        declares :attr:`completion_from_tokens` when it needs no advance first."""
        return [g.is_terminated() for g in grammars]

    def stop_token_ids(self) -> list[int]:
        """The tokens a complete grammar allows; with :attr:`completion_from_tokens`,
        sampling one of them is what completes a grammar (the grammar process tells
        completion from them without asking the grammars). Default: the model's EOS ids."""
        return list(self.eos_token_ids)

    def allocate_token_bitmask(self, max_num_seqs: int) -> np.ndarray:
        """A ``[max_num_seqs, ceil(vocab_size / 32)]`` int32 array, all tokens allowed."""
        import numpy as np

        return np.full((max_num_seqs, (self.vocab_size + 31) // 32), -1, dtype=np.int32)

    def destroy(self) -> None:
        """Release what the backend holds (the engine is shutting down)."""


__all__ = ["REQUEST_TYPES", "StructuredOutputBackend", "StructuredOutputGrammar"]
