"""``deepseek_r1``: everything up to ``</think>`` is reasoning; ``<think>`` may be missing.

DeepSeek-R1's chat template writes ``<think>`` into the prompt, so the output often
starts inside the block. An output without ``</think>`` is all reasoning (the model was
stopped while still thinking).
"""

from __future__ import annotations

from forkless.reasoning.think import ThinkTagReasoningParser


class DeepSeekR1ReasoningParser(ThinkTagReasoningParser):
    """The ``deepseek_r1`` reasoning parser."""

    def split(self, text: str, final: bool) -> tuple[str, str]:
        if text.startswith(self.start_tag):
            text = text[len(self.start_tag):]
        elif not final and self.start_tag.startswith(text):
            return "", ""  # "<thi": is it the start tag? the next step tells
        return self._after_start(text, final)
