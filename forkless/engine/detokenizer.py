"""Incremental detokenization (torch-free; runs in the API server).

Text is produced token by token without re-decoding the whole output: the last few
tokens are decoded with and without the new one and the difference is the new text.
A trailing U+FFFD means the new token ends inside a multi-byte UTF-8 character
(byte-level BPE or byte-fallback tokens), so the text is held back until a later token
completes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Tokens of prompt context decoded along with the first output tokens, so that
# tokenizers that drop a leading space at the start of a text keep it mid-sentence.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns one request's generated token ids into text, a token at a time.

    Args:
        tokenizer: A Hugging Face tokenizer.
        prompt_token_ids: The prompt (its tail gives context to the first tokens).
        skip_special_tokens: Omit special tokens from the text.

    Attributes:
        output_text: All text produced so far.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        context = prompt_token_ids[-(_CONTEXT_TOKENS + 1):]
        self.tokens: list[str] = self._to_tokens(context, skip_special_tokens=False)
        self.prefix_offset = max(len(self.tokens) - _CONTEXT_TOKENS, 0)
        self.read_offset = len(self.tokens)
        self.output_text = ""

    def _to_tokens(self, ids: list[int], skip_special_tokens: bool) -> list[str]:
        tokens = self.tokenizer.convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)
        return [t for t in tokens if t is not None]

    def update(self, token_ids: list[int]) -> str:
        """Add generated tokens.

        Args:
            token_ids: The new token ids, in order.

        Returns:
            The new text (possibly empty while a character is incomplete).
        """
        delta = []
        for token_id in token_ids:
            self.tokens.extend(self._to_tokens([token_id], self.skip_special_tokens))
            prefix_text = self._text(self.tokens[self.prefix_offset : self.read_offset])
            new_text = self._text(self.tokens[self.prefix_offset :])
            if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
                delta.append(new_text[len(prefix_text) :])
                self.prefix_offset = self.read_offset
                self.read_offset = len(self.tokens)
        text = "".join(delta)
        self.output_text += text
        return text

    def _text(self, tokens: list[str]) -> str:
        if not tokens:
            return ""
        return self.tokenizer.convert_tokens_to_string(tokens)

    def decode_token(self, token_id: int) -> str:
        """One token's own text (for logprobs)."""
        return self.tokenizer.decode([token_id])
