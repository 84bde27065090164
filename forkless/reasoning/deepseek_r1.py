"""``deepseek_r1``: everything up to ``</think>`` is reasoning; ``<think>`` may be missing.

DeepSeek-R1's chat template writes ``<think>`` into the prompt, so the output often
starts inside the block; when the model writes the tag itself (after a newline, say), the
tag and the whitespace before it are dropped. An output without ``</think>`` is all
reasoning (the model was stopped while still thinking). As in vLLM, the reasoning is
``""`` rather than ``None`` when the block is there but empty, or the output is empty.
"""

from __future__ import annotations

from forkless.reasoning.basic_parsers import BaseThinkingReasoningParser


class DeepSeekR1ReasoningParser(BaseThinkingReasoningParser):
    """The ``deepseek_r1`` reasoning parser."""

    start_token = "<think>"
    end_token = "</think>"
