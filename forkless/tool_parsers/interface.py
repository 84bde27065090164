"""The ``ToolParser`` interface (public tier): turns model text into OpenAI tool calls."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Sequence

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    from forkless.protocol.openai import (
        ChatCompletionRequest,
        DeltaMessage,
        ExtractedToolCallInformation,
    )


@stability(Stability.PUBLIC)
class ToolParser(ABC):
    """Extracts tool calls from a model's output, whole or streamed.

    The API server creates one instance per chat request, so an implementation may keep
    per-request state between streaming calls.

    Args:
        tokenizer: The served model's tokenizer.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.model_tokenizer = tokenizer

    def adjust_request(self, request: "ChatCompletionRequest") -> "ChatCompletionRequest":
        """Change a request before generation (e.g. keep special tokens that mark calls).

        Args:
            request: The chat request; it may be modified in place.

        Returns:
            The request to use.
        """
        return request

    @abstractmethod
    def extract_tool_calls(self, model_output: str,
                           request: "ChatCompletionRequest") -> "ExtractedToolCallInformation":
        """Find the tool calls in a finished output.

        Args:
            model_output: The generated text (the content part, when a reasoning parser
                already took the reasoning out).
            request: The chat request.

        Returns:
            Whether tools were called, the calls, and the remaining content.
        """

    @abstractmethod
    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: "ChatCompletionRequest",
    ) -> "DeltaMessage | None":
        """Turn one streamed step into a delta.

        ``current_text == previous_text + delta_text``. Concatenating the ``content`` and,
        per tool index, the ``function.arguments`` of all returned deltas must give what
        :meth:`extract_tool_calls` returns for the final text.

        Returns:
            A ``DeltaMessage`` with ``content`` and/or ``tool_calls`` (each ``DeltaToolCall``
            carries its ``index``; the first for an index carries ``id``, ``type`` and
            ``function.name``), or ``None`` when there is nothing to send yet.
        """
