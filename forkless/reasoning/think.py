"""A base for parsers of ``<think>…</think>`` reasoning blocks.

Like the tool parsers, it re-reads the whole text at each streaming step and sends the
difference: a read of a prefix only ever reports prefixes of the final split, so the
streamed pieces add up to the whole-output result. A tag cut in half at the end of the
text ("``</thi``") is held back until the next step decides it.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Sequence

from forkless.protocol.openai import DeltaMessage
from forkless.reasoning.interface import ReasoningParser

if TYPE_CHECKING:
    from forkless.protocol.openai import ChatCompletionRequest


def held_tag_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkTagReasoningParser(ReasoningParser):
    """Reasoning between ``start_tag`` and ``end_tag``; subclasses say where it starts."""

    start_tag = "<think>"
    end_tag = "</think>"

    @abstractmethod
    def split(self, text: str, final: bool) -> tuple[str, str]:
        """Split ``text`` into ``(reasoning, content)``.

        Args:
            text: The model's text so far.
            final: The text is complete, so hold nothing back.
        """

    def _after_start(self, body: str, final: bool) -> tuple[str, str]:
        """Split the text that follows the (possibly implicit) start tag."""
        k = body.find(self.end_tag)
        if k >= 0:
            return body[:k], body[k + len(self.end_tag):]
        return (body if final else body[: len(body) - held_tag_prefix(body, self.end_tag)]), ""

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        end_id = self.model_tokenizer.get_vocab().get(self.end_tag)
        if end_id is not None:
            return end_id in input_ids
        # The tag is several tokens in this vocabulary: look for it in the text.
        return self.end_tag in self.model_tokenizer.decode(list(input_ids))

    def extract_reasoning_content(self, model_output: str,
                                  request: "ChatCompletionRequest") -> tuple[str | None, str | None]:
        reasoning, content = self.split(model_output, final=True)
        return reasoning or None, content or None

    def extract_reasoning_content_streaming(
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
        reasoning = new_r[len(old_r):] if new_r.startswith(old_r) else ""
        content = new_c[len(old_c):] if new_c.startswith(old_c) else ""
        if not reasoning and not content:
            return None
        return DeltaMessage(reasoning_content=reasoning or None, content=content or None)
