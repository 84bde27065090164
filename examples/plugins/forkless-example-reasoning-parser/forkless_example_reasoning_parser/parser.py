"""A reasoning parser for outputs that start with ``<thought>reasoning</thought>``."""

from __future__ import annotations

from typing import Any, Sequence

from forkless.reasoning import DeltaMessage, ReasoningParser

START, END = "<thought>", "</thought>"


def _split(text: str, final: bool) -> tuple[str, str]:
    """``(reasoning, content)`` of the text so far; unless ``final``, a tag cut in half
    at the end is held back until the next piece of text decides what it is."""
    if not text.startswith(START):
        if not final and START.startswith(text):
            return "", ""  # may still become "<thought>"
        return "", text  # no reasoning: all content
    body = text[len(START):]
    end = body.find(END)
    if end >= 0:
        return body[:end], body[end + len(END):]
    if not final:
        for n in range(min(len(END) - 1, len(body)), 0, -1):
            if body.endswith(END[:n]):
                return body[:-n], ""
    return body, ""


class ThoughtTagReasoningParser(ReasoningParser):
    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        return END in self.model_tokenizer.decode(list(input_ids))

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        reasoning, content = _split(model_output, final=True)
        return reasoning or None, content or None

    def extract_reasoning_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                    previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
                                    delta_token_ids: Sequence[int]) -> DeltaMessage | None:
        # Split the text before and after this step and send what grew.
        old_reasoning, old_content = _split(previous_text, final=False)
        reasoning, content = _split(current_text, final=False)
        reasoning, content = reasoning[len(old_reasoning):], content[len(old_content):]
        if not reasoning and not content:
            return None
        return DeltaMessage(reasoning=reasoning or None, content=content or None)
