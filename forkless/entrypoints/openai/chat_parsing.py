"""Reasoning and tool-call parsing of one chat choice, whole or streamed.

The reasoning parser sees the raw text; the tool parser sees only the content part of it,
so a model may think first and then call tools.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from forkless.protocol.openai import (
    ChatResponseMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
)

if TYPE_CHECKING:
    from forkless.protocol.openai import ChatCompletionRequest
    from forkless.reasoning import ReasoningParser
    from forkless.tool_parsers import ToolParser


@dataclass
class _Sent:
    """What a stream has sent so far, to top it up when the output finishes."""

    reasoning: str = ""
    content: str = ""
    names: dict[int, str] = field(default_factory=dict)
    arguments: dict[int, str] = field(default_factory=dict)


class ChoiceParser:
    """Parses one choice's output with the request's reasoning and tool parsers.

    Args:
        request: The chat request.
        reasoning: A reasoning parser instance, or ``None``.
        tools: A tool parser instance, or ``None`` (no tool parsing for this request).
    """

    def __init__(self, request: "ChatCompletionRequest", reasoning: "ReasoningParser | None",
                 tools: "ToolParser | None") -> None:
        self.request = request
        self.reasoning = reasoning
        self.tools = tools
        self._text = ""
        self._ids: list[int] = []
        self._content = ""
        self._sent = _Sent()

    def set_prompt(self, prompt_token_ids: list[int]) -> None:
        """Tell the parser the prompt. As in vLLM, when the prompt already ends the
        reasoning (a template that closed the think block, as Qwen3's does with
        ``enable_thinking=False``), the whole output is content; else the reasoning parser's
        ``adjust_initial_state_from_prompt`` sees the prompt."""
        if self.reasoning is None:
            return
        try:
            ended = self.reasoning.is_reasoning_end(prompt_token_ids)
        except NotImplementedError:
            ended = False
        if ended:
            self.reasoning = None
        else:
            self.reasoning.adjust_initial_state_from_prompt(prompt_token_ids)

    def reasoning_tokens(self, token_ids: list[int]) -> int:
        """How many of the output's ``token_ids`` are reasoning, as the reasoning parser
        counts them (0 without one, or where the prompt ended the reasoning)."""
        return self.reasoning.count_reasoning_tokens(token_ids) if self.reasoning is not None else 0

    @property
    def called_tools(self) -> bool:
        """Whether the stream has sent at least one tool call."""
        return bool(self._sent.names)

    def parse_whole(self, text: str) -> ChatResponseMessage:
        """The message for a finished output."""
        if self.reasoning is None and self.tools is None:
            return ChatResponseMessage(content=text)
        reasoning, content = (_split(self.reasoning, self.reasoning.extract_reasoning(text, self.request))
                              if self.reasoning is not None else (None, text))
        message = ChatResponseMessage(content=content, reasoning=reasoning)
        if self.tools is not None and content is not None:
            info = checked_return(self.tools, "extract_tool_calls", self.tools.extract_tool_calls(content, self.request),
                            ExtractedToolCallInformation)
            if info.tools_called:
                # parallel_tool_calls=false: at most one call (OpenAI's meaning), the first.
                message.tool_calls = list(info.tool_calls)[: 1 if self.request.parallel_tool_calls is False else None]
                message.content = info.content
            elif info.content is not None:
                # No calls, but the parser's content (markup of a call it dropped, say) is
                # what its stream sent: the whole output says the same.
                message.content = info.content
        return message

    def step(self, text: str, token_ids: list[int]) -> DeltaMessage | None:
        """The delta for a streamed step, given the cumulative text and token ids."""
        delta_text, delta_ids = text[len(self._text):], token_ids[len(self._ids):]
        reasoning: str | None = None
        content: str | None = delta_text or None
        if self.reasoning is not None:
            dm = checked_return(self.reasoning, "extract_reasoning_streaming", self.reasoning.extract_reasoning_streaming(
                self._text, text, delta_text, self._ids, token_ids, delta_ids), DeltaMessage, None)
            reasoning, content = (dm.reasoning, dm.content) if dm is not None else (None, None)
        tool_calls = None
        if self.tools is not None and content:
            current = self._content + content
            dm = checked_return(self.tools, "extract_tool_calls_streaming", self.tools.extract_tool_calls_streaming(
                self._content, current, content, self._ids, token_ids, delta_ids, self.request), DeltaMessage, None)
            self._content = current
            content, tool_calls = (dm.content, dm.tool_calls) if dm is not None else (None, None)
            if tool_calls and self.request.parallel_tool_calls is False:
                tool_calls = [c for c in tool_calls if c.index == 0]  # as parse_whole: the first call only
        self._text, self._ids = text, list(token_ids)
        return self._record(DeltaMessage(reasoning=reasoning or None, content=content or None,
                                         tool_calls=tool_calls or None))

    def finish(self, text: str) -> DeltaMessage | None:
        """Whatever the stream still owes once the output is final.

        Streaming parsers hold back text that might still become a tag; at the end, the
        whole-output parse says what it was. Only extensions of what was sent are added.
        Calls already streamed that the whole output turns out not to hold (cut off by
        ``max_tokens``, or broken at the end) cannot be taken back; the whole parse makes
        their text content, which is not sent again.
        """
        whole = self.parse_whole(text)
        sent = self._sent
        reasoning = _rest(sent.reasoning, whole.reasoning or "")
        content = _rest(sent.content, whole.content or "") if whole.tool_calls or not sent.names else ""
        calls = []
        for i, call in enumerate(whole.tool_calls if self.tools is not None else []):
            if i not in sent.names:
                calls.append(DeltaToolCall(index=i, id=call.id, type="function", function=DeltaFunctionCall(
                    name=call.function.name, arguments=call.function.arguments)))
            elif sent.names[i] == call.function.name:
                more = _rest(sent.arguments.get(i, ""), call.function.arguments)
                if more:
                    calls.append(DeltaToolCall(index=i, function=DeltaFunctionCall(arguments=more)))
        return self._record(DeltaMessage(reasoning=reasoning or None, content=content or None,
                                         tool_calls=calls or None))

    def _record(self, delta: DeltaMessage) -> DeltaMessage | None:
        if delta.reasoning is None and delta.content is None and not delta.tool_calls:
            return None
        self._sent.reasoning += delta.reasoning or ""
        self._sent.content += delta.content or ""
        for call in delta.tool_calls or []:
            fn = call.function
            if fn is not None and fn.name is not None:
                self._sent.names[call.index] = fn.name
            if fn is not None and fn.arguments:
                self._sent.arguments[call.index] = self._sent.arguments.get(call.index, "") + fn.arguments
        return delta


def _rest(sent: str, whole: str) -> str:
    return whole[len(sent):] if whole.startswith(sent) else ""


def _wrong_return(parser: Any, method: str, value: Any, expected: str) -> TypeError:
    return TypeError(f"{type(parser).__module__}.{type(parser).__qualname__}.{method} returned "
                     f"{type(value).__name__}, expected {expected}")


def checked_return(parser: Any, method: str, value: Any, *expected: Any) -> Any:
    """``value``, when it is what ``parser.method`` must return: an instance of one of
    ``expected`` (``None`` for ``None``). A plugin's wrong type would otherwise fail further
    on, naming neither the parser nor what it returned.

    Raises:
        TypeError: It is not (the message names the parser, the method and the types).
    """
    if not any(value is None if kind is None else isinstance(value, kind) for kind in expected):
        raise _wrong_return(parser, method, value,
                            " or ".join("None" if kind is None else kind.__name__ for kind in expected))
    return value


def _split(parser: Any, value: Any) -> tuple[str | None, str | None]:
    """``extract_reasoning``'s ``(reasoning, content)``, checked."""
    if not (isinstance(value, tuple) and len(value) == 2
            and all(part is None or isinstance(part, str) for part in value)):
        raise _wrong_return(parser, "extract_reasoning", value, "a (reasoning, content) tuple of str or None")
    return value


def make_choice_parser(request: "ChatCompletionRequest", tokenizer: Any, reasoning_parser: str | None,
                       tool_parser: str | None, model_config: Any = None) -> ChoiceParser:
    """A ``ChoiceParser`` with fresh parser instances (they may keep per-request state).

    The parsers are built as vLLM builds them: ``ReasoningParser(tokenizer,
    model_config=..., chat_template_kwargs=...)`` and ``ToolParser(tokenizer, request.tools)``.
    """
    from forkless.reasoning import ReasoningParserManager
    from forkless.tool_parsers import ToolParserManager

    reasoning = (ReasoningParserManager.create(reasoning_parser, tokenizer, model_config=model_config,
                                               chat_template_kwargs=request.chat_template_kwargs or {})
                 if reasoning_parser else None)
    tools = ToolParserManager.create(tool_parser, tokenizer, request.tools) if tool_parser else None
    return ChoiceParser(request, reasoning, tools)
