"""The ``ToolParser`` interface (public tier): turns model text into OpenAI tool calls.

The API is vLLM's: a parser written for vLLM ports by renaming ``vllm`` to ``forkless``
in its imports.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from functools import cached_property
from typing import TYPE_CHECKING, Any, Sequence

from forkless.logger import init_logger
from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    from forkless.protocol.openai import (
        ChatCompletionRequest,
        ChatCompletionToolParam,
        DeltaMessage,
        ExtractedToolCallInformation,
    )

logger = init_logger(__name__)


@stability(Stability.PUBLIC)
class ToolParser(ABC):
    """Extracts tool calls from a model's output, whole or streamed.

    The API server creates one instance per chat request and choice, as
    ``cls(tokenizer, request.tools)`` like vLLM (a parser whose constructor takes only the
    tokenizer is built without the tools), so an implementation may keep per-request
    state between streaming calls.

    The base keeps the streaming state vLLM's parsers share: ``prev_tool_call_arr`` (the
    calls parsed so far, as dicts), ``current_tool_id`` (index of the call being streamed,
    -1 before the first), ``current_tool_name_sent`` and ``streamed_args_for_tool`` (the
    arguments text sent so far, per call).

    Args:
        tokenizer: The served model's tokenizer.
        tools: The request's tools, or ``None`` (kept as ``self.tools``, ``[]`` for none).
    """

    #: vLLM's: ``False`` for a parser that reads calls in its model's own format even under
    #: ``tool_choice`` ``"required"`` or a named function, which then go unconstrained and
    #: are parsed as ``"auto"`` (by default they are constrained to a JSON array of calls,
    #: which the server reads itself).
    supports_required_and_named: bool = True
    #: vLLM's xgrammar structural-tag format name. forkless does not constrain tool calls
    #: with structural tags: a subclass that sets it is told so once, when it is defined.
    structural_tag_model: str | None = None
    #: vLLM's ``--tool-strict-level`` default for structural tags; unused, as above.
    default_tool_strict_level: Any = None
    #: vLLM's flag for parsers fed by the engine's own streaming parser; forkless always
    #: calls ``extract_tool_calls_streaming`` with the text, so it is not read.
    engine_based_streaming: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.structural_tag_model is not None and "structural_tag_model" in cls.__dict__:
            logger.warning("%s sets structural_tag_model=%r: forkless does not constrain tool calls with "
                           "xgrammar structural tags (tool_choice \"required\" or a named function is "
                           "constrained to a JSON array of calls unless supports_required_and_named is "
                           "False)", cls.__qualname__, cls.structural_tag_model)

    def __init__(self, tokenizer: Any, tools: "list[ChatCompletionToolParam] | None" = None) -> None:
        self.prev_tool_call_arr: list[dict[str, Any]] = []
        self.current_tool_id: int = -1
        self.current_tool_name_sent: bool = False
        self.streamed_args_for_tool: list[str] = []
        self.model_tokenizer = tokenizer
        self.tools = list(tools) if tools else []

    def get_remaining_unstreamed_args(self) -> str:
        """The latest call's arguments (``prev_tool_call_arr[-1]["arguments"]``, as JSON)
        beyond what ``streamed_args_for_tool`` says was sent, or ``""`` when the two
        disagree (vLLM's helper for topping up a stream at its end)."""
        if not self.prev_tool_call_arr:
            return ""
        index = len(self.prev_tool_call_arr) - 1
        arguments = self.prev_tool_call_arr[index].get("arguments", {})
        whole = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        sent = self.streamed_args_for_tool[index] if index < len(self.streamed_args_for_tool) else ""
        return whole[len(sent):] if whole.startswith(sent) else ""

    @cached_property
    def vocab(self) -> dict[str, int]:
        """The tokenizer's vocabulary (token -> id)."""
        return self.model_tokenizer.get_vocab()

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
