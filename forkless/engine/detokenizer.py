"""Incremental detokenization (torch-free; runs in the API server).

Text is produced token by token without re-decoding the whole output. A fast tokenizer
(every tokenizer the ``tokenizers`` library backs) streams through its own Rust
``DecodeStream``; any other decodes the last few tokens with and without the new one
and keeps the difference. Either way, a new token that ends inside a multi-byte UTF-8
character (byte-level BPE or byte-fallback tokens) yields no text until a later token
completes the character, and a few prompt tokens go first as context, so that
tokenizers that drop a leading space at the start of a text keep it mid-sentence.

``spaces_between_special_tokens`` (vLLM's and transformers' flag, on by default) only acts
on the other path, as in both of them: the slow path decodes the runs between added
tokens separately and joins the pieces with a space, so kept special tokens stand apart
("Hello <|im_end|>  world"); a fast tokenizer's own decoder has no such option and
ignores it.

This runs once per generated token of every stream in the API server, hundreds of
streams at a time: the fast path is one Rust call per token (the other path costs two
``convert_tokens_to_string`` calls, ~40 us a token between them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers.decoders import DecodeStream

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Tokens of prompt context decoded along with the first output tokens.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns one request's generated token ids into text, a token at a time.

    Args:
        tokenizer: A Hugging Face tokenizer.
        prompt_token_ids: The prompt (its tail gives context to the first tokens).
        skip_special_tokens: Omit special tokens from the text.
        spaces_between_special_tokens: Without a fast tokenizer, join the text around
            added tokens with spaces (see the module docstring; fast tokenizers ignore it).

    Attributes:
        num_chars: Characters of text produced so far.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.separator = " " if spaces_between_special_tokens else ""
        self.num_chars = 0
        context = list(prompt_token_ids[-(_CONTEXT_TOKENS + 1):])
        # ``is_fast`` is part of every transformers tokenizer's interface.
        self._backend = tokenizer.backend_tokenizer if tokenizer.is_fast else None
        if self._backend is not None:
            self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)
            return
        # The context's special tokens follow the request's rule too (as vLLM's): kept,
        # they would stand apart from the first generated text by a space.
        self.tokens: list[str] = self._to_tokens(context, skip_special_tokens)
        self.added_vocab = frozenset(tokenizer.get_added_vocab())
        self.prefix_offset = max(len(self.tokens) - _CONTEXT_TOKENS, 0)
        self.read_offset = len(self.tokens)

    def update(self, token_ids: list[int]) -> str:
        """Add generated tokens.

        Args:
            token_ids: The new token ids, in order.

        Returns:
            The new text (possibly empty while a character is incomplete).
        """
        if self._backend is not None:
            step, backend = self._stream.step, self._backend
            if len(token_ids) == 1:
                text = step(backend, token_ids[0]) or ""
            else:
                text = "".join(piece for piece in (step(backend, t) for t in token_ids) if piece)
        else:
            text = self._update_slow(token_ids)
        self.num_chars += len(text)
        return text

    def _update_slow(self, token_ids: list[int]) -> str:
        delta = []
        for token_id in token_ids:
            self.tokens.extend(self._to_tokens([token_id], self.skip_special_tokens))
            prefix_text = self._text(self.tokens[self.prefix_offset : self.read_offset])
            new_text = self._text(self.tokens[self.prefix_offset :])
            if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
                delta.append(new_text[len(prefix_text) :])
                self.prefix_offset = self.read_offset
                self.read_offset = len(self.tokens)
        return "".join(delta)

    def _to_tokens(self, ids: list[int], skip_special_tokens: bool) -> list[str]:
        tokens = self.tokenizer.convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)
        return [t for t in tokens if t is not None]

    def _text(self, tokens: list[str]) -> str:
        if not tokens:
            return ""
        if not self.added_vocab.intersection(tokens):
            return self.tokenizer.convert_tokens_to_string(tokens)
        # Added tokens stand as they are; the runs between them are decoded on their own.
        pieces: list[str] = []
        run: list[str] = []
        for token in tokens:
            if token in self.added_vocab:
                if run:
                    pieces.append(self.tokenizer.convert_tokens_to_string(run))
                    run = []
                pieces.append(token)
            else:
                run.append(token)
        if run:
            pieces.append(self.tokenizer.convert_tokens_to_string(run))
        return self.separator.join(pieces)

    def decode_token(self, token_id: int) -> str:
        """One token's own text (for logprobs)."""
        return self.tokenizer.decode([token_id])
