"""The ``ReasoningParser`` interface (public tier): splits reasoning from the answer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Sequence

from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    from forkless.protocol.openai import ChatCompletionRequest, DeltaMessage


@stability(Stability.PUBLIC)
class ReasoningParser(ABC):
    """Separates a model's reasoning from its answer, whole or streamed.

    The API server creates one instance per chat request, so an implementation may keep
    per-request state between streaming calls.

    Args:
        tokenizer: The served model's tokenizer.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.model_tokenizer = tokenizer

    @abstractmethod
    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether the reasoning has ended within ``input_ids``."""

    @abstractmethod
    def extract_reasoning_content(self, model_output: str,
                                  request: "ChatCompletionRequest") -> tuple[str | None, str | None]:
        """Split a finished output.

        Returns:
            ``(reasoning_content, content)``; either is ``None`` when empty.
        """

    @abstractmethod
    def extract_reasoning_content_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> "DeltaMessage | None":
        """Turn one streamed step into a delta.

        ``current_text == previous_text + delta_text``. Concatenating the
        ``reasoning_content`` and the ``content`` of all returned deltas must give what
        :meth:`extract_reasoning_content` returns for the final text.

        Returns:
            A ``DeltaMessage`` with ``reasoning_content`` and/or ``content``, or ``None``
            when there is nothing to send yet.
        """
