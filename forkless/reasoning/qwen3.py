"""``qwen3``: Qwen3's ``<think>…</think>``, opened by the chat template or by the model.

As vLLM's ``qwen3`` parser:

* Everything up to ``</think>`` is reasoning, whether the output starts with ``<think>``
  or not (Qwen3.5's template, and Qwen3's with thinking on, write it into the prompt).
* Without ``</think>``, a ``<tool_call>`` that really starts a call ends the reasoning
  (Qwen3.5 models may call a tool without closing the block); the call is content, for
  the tool parser. Without either, everything is reasoning (the model was stopped while
  thinking).
* ``chat_template_kwargs={"enable_thinking": False}`` makes everything content.

A ``<tool_call>`` really starts a call when the next thing after it (whitespace aside) is
``<function`` (Qwen3-Coder's XML calls, the only form vLLM accepts) or ``{`` (a hermes JSON
call, which is what forkless's ``hermes`` tool parser reads). Since a later ``</think>``
would make the call part of the reasoning after all, streaming holds the text after such a
``<tool_call>`` back until the output ends.
"""

from __future__ import annotations

import re
from typing import Any

from forkless.reasoning.basic_parsers import BaseThinkingReasoningParser, held_tag_prefix

TOOL_CALL = "<tool_call>"
_CALL_START = re.compile(r"<function[\s=]|\{")
_FUNCTION = "<function"


class Qwen3ReasoningParser(BaseThinkingReasoningParser):
    """The ``qwen3`` reasoning parser."""

    start_token = "<think>"
    end_token = "</think>"

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        chat_kwargs = kwargs.get("chat_template_kwargs") or {}
        # Qwen3 thinks by default; enable_thinking=False (or another false value, as in
        # vLLM) turns it off.
        self.thinking_enabled = bool(chat_kwargs.get("enable_thinking", True))

    def split(self, text: str, final: bool) -> tuple[str | None, str | None]:
        if not self.thinking_enabled:
            return None, text
        body = self._after_start(text, final)
        if body is None:
            return "", ""
        k = body.find(self.end_token)
        if k >= 0:
            return body[:k], body[k + len(self.end_token):]
        call = self._tool_call_start(body, final)
        if call >= 0:
            if final:
                return body[:call] or None, body[call:] or None
            return body[:call], ""  # a "</think>" may still come: hold the rest back
        if final:
            return body, None
        hold = max(held_tag_prefix(body, self.end_token), held_tag_prefix(body, TOOL_CALL))
        return body[: len(body) - hold], ""

    @staticmethod
    def _tool_call_start(body: str, final: bool) -> int:
        """Where the first ``<tool_call>`` that starts a call is, or -1.

        Unless ``final``, a ``<tool_call>`` not yet followed by enough text to tell counts
        too (its text is held back all the same).
        """
        pos = body.find(TOOL_CALL)
        while pos >= 0:
            after = body[pos + len(TOOL_CALL):].lstrip()
            if _CALL_START.match(after) or (not final and _FUNCTION.startswith(after)):
                return pos
            pos = body.find(TOOL_CALL, pos + 1)
        return -1
