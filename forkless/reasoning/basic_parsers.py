"""``BaseThinkingReasoningParser``: reasoning between a start and an end tag (vLLM's base).

A subclass sets ``start_token`` and ``end_token`` (``"<think>"``, ``"</think>"``), as a
class attribute or a property. The whole-output split is vLLM's: leading whitespace and a
start tag are dropped (the chat template may have opened the block, so the tag may be
missing), everything up to the end tag is reasoning and the rest is content; without an
end tag everything is reasoning (the model was stopped while thinking).

Streaming re-reads the whole text at each step and sends the difference: a read of a
prefix only ever reports prefixes of the final split, so the streamed pieces add up to
the whole-output result. Text that may still turn out to be a tag (``"</thi"`` at the end)
is held back until the next step decides it.

Unlike vLLM's base, the tags need not be single tokens of the vocabulary (nor need a
tokenizer be given): token-id questions fall back to decoding the ids.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Sequence

from forkless.protocol.openai import DeltaMessage
from forkless.reasoning.interface import ReasoningParser

if TYPE_CHECKING:
    from forkless.protocol.openai import ChatCompletionRequest

_WS = " \t\r\n"


_VOCABS: "weakref.WeakKeyDictionary[Any, dict[str, int]]" = weakref.WeakKeyDictionary()


def single_token_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token`` when it is one entry of the vocabulary, else ``None``.

    The vocabulary is read once per tokenizer (parsers are created per request).
    """
    if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return None
    try:
        vocab = _VOCABS[tokenizer]
    except KeyError:
        vocab = _VOCABS.setdefault(tokenizer, tokenizer.get_vocab())
    except TypeError:  # not weak-referenceable: no cache
        vocab = tokenizer.get_vocab()
    return vocab.get(token)


def held_tag_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class BaseThinkingReasoningParser(ReasoningParser):
    """Reasoning delimited by ``start_token`` and ``end_token``."""

    start_token: str = ""
    end_token: str = ""
    #: Whether an output without the start tag is reasoning from its first token (the
    #: chat template opened the block); a subclass whose template can turn thinking off
    #: sets it per request.
    thinking_enabled: bool = True

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        if not self.start_token or not self.end_token:
            raise ValueError(f"{type(self).__name__}: start_token and end_token must be set")
        # The tags' ids where each is one token of the vocabulary (as vLLM requires), else None.
        self.start_token_id: int | None = single_token_id(tokenizer, self.start_token)
        self.end_token_id: int | None = single_token_id(tokenizer, self.end_token)

    @property
    def reasoning_start_str(self) -> str:
        return self.start_token

    @property
    def reasoning_end_str(self) -> str:
        return self.end_token

    # -- text ---------------------------------------------------------------------------
    def split(self, text: str, final: bool) -> tuple[str | None, str | None]:
        """Split ``text`` into ``(reasoning, content)``.

        Args:
            text: The model's text so far.
            final: The text is complete: decide everything. Otherwise hold back what the
                next step may still change, and return only what is settled.
        """
        body = self._after_start(text, final)
        if body is None:
            return "", ""
        k = body.find(self.end_token)
        if k >= 0:
            return body[:k], body[k + len(self.end_token):]
        if final:
            return body, None
        return body[: len(body) - held_tag_prefix(body, self.end_token)], ""

    def _after_start(self, text: str, final: bool) -> str | None:
        """The text after a leading start tag (and the whitespace before it), or the text
        itself when it does not start with the tag; ``None`` while that is undecided."""
        rest = text.lstrip(_WS)
        if rest.startswith(self.start_token):
            return rest[len(self.start_token):]
        if not final and self.start_token.startswith(rest):
            return None  # "", "\n" or "<thi": the next step tells
        return text

    def extract_reasoning(self, model_output: str,
                          request: "ChatCompletionRequest") -> tuple[str | None, str | None]:
        reasoning, content = self.split(model_output, final=True)
        return reasoning, content or None

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        old_r, old_c = self.split(previous_text, final=False)
        new_r, new_c = self.split(current_text, final=False)
        reasoning = _growth(old_r, new_r)
        content = _growth(old_c, new_c)
        if not reasoning and not content:
            return None
        return DeltaMessage(reasoning=reasoning or None, content=content or None)

    # -- token ids ----------------------------------------------------------------------
    def _decode(self, ids: Sequence[int]) -> str:
        return self.model_tokenizer.decode(list(ids), skip_special_tokens=False)

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether the last tag in ``input_ids`` is an end tag (as vLLM scans them)."""
        if self.start_token_id is not None and self.end_token_id is not None:
            for token in reversed(input_ids):
                if token == self.start_token_id:
                    return False
                if token == self.end_token_id:
                    return True
            return False
        text = self._decode(input_ids)  # a tag of several tokens: look in the text
        return text.rfind(self.end_token) > text.rfind(self.start_token)

    def _tag_ids(self, tag: str, token_id: int | None) -> list[int]:
        """The ids of ``tag``: its one token, else its own tokenization (empty without a
        tokenizer)."""
        if token_id is not None:
            return [token_id]
        encode = getattr(self.model_tokenizer, "encode", None)
        return list(encode(tag, add_special_tokens=False)) if encode is not None else []

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """The tokens between the start tag (or the output's start, when thinking is on
        and the template opened the block) and the first end tag, or the output's end:
        vLLM's count, which finds each tag as its run of token ids and counts neither."""
        ids = list(token_ids)
        start_ids = self._tag_ids(self.start_token, self.start_token_id)
        end_ids = self._tag_ids(self.end_token, self.end_token_id)
        if not start_ids or not end_ids:
            return 0
        found = _find(ids, start_ids)
        if found >= 0:
            start = found + len(start_ids)
        elif self.thinking_enabled:
            start = 0
        else:
            return 0
        end = _find(ids, end_ids)
        return max(0, (end if end >= 0 else len(ids)) - start)

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        """The ids after the first end tag; ``[]`` when there is none yet."""
        if self.end_token_id is not None:
            if self.end_token_id not in input_ids[:-1]:
                return []
            return input_ids[input_ids.index(self.end_token_id) + 1:]
        for i in range(1, len(input_ids) + 1):
            if self.end_token in self._decode(input_ids[:i]):
                return input_ids[i:]
        return []


def _find(ids: list[int], sub: list[int]) -> int:
    """Where the first run of ``sub`` starts in ``ids``, or -1."""
    first = sub[0]
    for i, token in enumerate(ids):
        if token == first and ids[i:i + len(sub)] == sub:
            return i
    return -1


def _growth(old: str | None, new: str | None) -> str:
    """What ``new`` adds to ``old`` (both prefixes of the final value, or unset)."""
    old, new = old or "", new or ""
    return new[len(old):] if new.startswith(old) else ""
