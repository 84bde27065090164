"""``qwen3``: an output that starts with ``<think>`` reasons until ``</think>``.

An output without a leading think block (e.g. ``enable_thinking=False``) is all content.
"""

from __future__ import annotations

from forkless.reasoning.think import ThinkTagReasoningParser


class Qwen3ReasoningParser(ThinkTagReasoningParser):
    """The ``qwen3`` reasoning parser."""

    def split(self, text: str, final: bool) -> tuple[str, str]:
        if text.startswith(self.start_tag):
            return self._after_start(text[len(self.start_tag):], final)
        if not final and self.start_tag.startswith(text):
            return "", ""
        return "", text
