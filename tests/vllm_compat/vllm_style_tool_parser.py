"""A tool parser written the way vLLM's docs and built-in parsers write one (vLLM 0.33 API:
``ToolParser(tokenizer, tools)``, the base class's streaming state, ``make_tool_call_id``,
``DeltaFunctionCall(...).model_dump(exclude_none=True)``, ``register_lazy_module`` with
keywords at the end of the file), with only the imports renamed (``vllm`` -> ``forkless``).

Calls are written ``[CALL] name {json arguments} [/CALL]``; text before the first call is
content. While streaming, a call's name is sent as soon as it is known, and its arguments
once the call is closed. The model writes calls in that format whatever the tool choice,
so the parser reads ``"required"`` and named choices too (``supports_required_and_named =
False``: vLLM then leaves them unconstrained).
"""

import json
from collections.abc import Sequence

import regex as re

from forkless.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from forkless.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from forkless.logger import init_logger
from forkless.renderers.chat_utils import make_tool_call_id
from forkless.tokenizers import TokenizerLike
from forkless.tool_parsers import ToolParser, ToolParserManager
from forkless.tool_parsers.abstract_tool_parser import Tool

logger = init_logger(__name__)


class CallTagToolParser(ToolParser):
    supports_required_and_named = False

    def __init__(self, tokenizer: TokenizerLike, tools: list[Tool] | None = None):
        super().__init__(tokenizer, tools)
        self.call_start = "[CALL]"
        self.call_end = "[/CALL]"
        self.call_regex = re.compile(r"\[CALL\]\s*(\w+)\s*(\{.*?\})\s*\[/CALL\]", re.DOTALL)
        self.name_regex = re.compile(r"\[CALL\]\s*(\w+)\s*\{", re.DOTALL)

    def adjust_request(self, request: ChatCompletionRequest) -> ChatCompletionRequest:
        return request

    def extract_tool_calls(
        self,
        model_output: str,
        request: ChatCompletionRequest,
    ) -> ExtractedToolCallInformation:
        if self.call_start not in model_output:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        try:
            tool_calls = [
                ToolCall(
                    type="function",
                    function=FunctionCall(
                        name=name,
                        arguments=json.dumps(json.loads(arguments), ensure_ascii=False),
                    ),
                )
                for name, arguments in self.call_regex.findall(model_output)
            ]
        except Exception:
            logger.exception("Error in extracting tool call from response.")
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        if not tool_calls:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        content = model_output[: model_output.find(self.call_start)]
        return ExtractedToolCallInformation(tools_called=True, tool_calls=tool_calls, content=content or None)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        if self.call_start not in current_text:
            # Plain text, except an end that may still become "[CALL]".
            sent = self._settled_content(previous_text)
            text = self._settled_content(current_text)
            return DeltaMessage(content=text[len(sent):]) if len(text) > len(sent) else None

        if self.call_start not in previous_text:
            # The first call starts in this delta: send the text before it.
            before = current_text[: current_text.find(self.call_start)]
            rest = before[len(self._settled_content(previous_text)):]
            if rest:
                return DeltaMessage(content=rest)

        names = self.name_regex.findall(current_text)
        complete = self.call_regex.findall(current_text)
        if self.current_tool_id >= 0 and len(complete) > self.current_tool_id \
                and not self.streamed_args_for_tool[self.current_tool_id]:
            # The current call is closed: send its arguments.
            arguments = json.dumps(json.loads(complete[self.current_tool_id][1]), ensure_ascii=False)
            self.streamed_args_for_tool[self.current_tool_id] = arguments
            self.prev_tool_call_arr[self.current_tool_id]["arguments"] = arguments
            return DeltaMessage(tool_calls=[
                DeltaToolCall(
                    index=self.current_tool_id,
                    function=DeltaFunctionCall(arguments=arguments).model_dump(exclude_none=True),
                )
            ])
        if len(names) > self.current_tool_id + 1:
            # A new call: send its name.
            self.current_tool_id += 1
            self.current_tool_name_sent = True
            self.streamed_args_for_tool.append("")
            self.prev_tool_call_arr.append({"name": names[self.current_tool_id]})
            return DeltaMessage(tool_calls=[
                DeltaToolCall(
                    index=self.current_tool_id,
                    type="function",
                    id=make_tool_call_id(),
                    function=DeltaFunctionCall(name=names[self.current_tool_id]).model_dump(exclude_none=True),
                )
            ])
        return None

    def _settled_content(self, text: str) -> str:
        for n in range(min(len(self.call_start) - 1, len(text)), 0, -1):
            if text.endswith(self.call_start[:n]):
                return text[:-n]
        return text


ToolParserManager.register_lazy_module(
    name="vllm_style_call",
    module_path="vllm_style_tool_parser",
    class_name="CallTagToolParser",
)
