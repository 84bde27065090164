"""A reasoning parser written the way vLLM's docs write one ("How to support a new
reasoning model", vLLM 0.33 API), with only the imports renamed (``vllm`` -> ``forkless``).

Reasoning is written ``[THOUGHT]...[/THOUGHT]`` before the answer;
``chat_template_kwargs={"thinking": False}`` turns it off, and ``{"answer_stop": TEXT}``
makes ``adjust_request`` return a copy of the request that stops at TEXT. Registered with
the decorator, as a ``--reasoning-parser-plugin`` file registers itself.
"""

from collections.abc import Sequence

from forkless.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from forkless.entrypoints.openai.engine.protocol import DeltaMessage
from forkless.entrypoints.openai.responses.protocol import ResponsesRequest
from forkless.reasoning import ReasoningParser, ReasoningParserManager
from forkless.tokenizers import TokenizerLike


@ReasoningParserManager.register_module(["vllm_style_thought"])
class ThoughtReasoningParser(ReasoningParser):
    start_token = "[THOUGHT]"
    end_token = "[/THOUGHT]"

    def __init__(self, tokenizer: TokenizerLike, *args, **kwargs):
        super().__init__(tokenizer, *args, **kwargs)
        chat_kwargs = kwargs.get("chat_template_kwargs", {}) or {}
        self.thinking = chat_kwargs.get("thinking", True)
        self.max_model_len = self._model_config.max_model_len if self._model_config is not None else None
        self.prompt_len: int | None = None

    def adjust_request(self, request: ChatCompletionRequest | ResponsesRequest) -> ChatCompletionRequest | ResponsesRequest:
        request = super().adjust_request(request)
        stop = (request.chat_template_kwargs or {}).get("answer_stop")
        return request.model_copy(update={"stop": [stop]}) if stop else request

    def adjust_initial_state_from_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        self.prompt_len = len(prompt_token_ids)

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        text = self.model_tokenizer.decode(list(input_ids))
        return text.rfind(self.end_token) > text.rfind(self.start_token)

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        for i in range(len(input_ids)):
            if self.end_token in self.model_tokenizer.decode(input_ids[: i + 1]):
                return input_ids[i + 1:]
        return []

    def _split(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) of ``text``; unless final, a tag cut in two is held back."""
        if not self.thinking:
            return "", text
        if not text.startswith(self.start_token):
            if not final and self.start_token.startswith(text):
                return "", ""
            return "", text
        body = text[len(self.start_token):]
        reasoning, end, content = body.partition(self.end_token)
        if end or final:
            return reasoning, content
        for n in range(min(len(self.end_token) - 1, len(body)), 0, -1):
            if body.endswith(self.end_token[:n]):
                return body[:-n], ""
        return body, ""

    def extract_reasoning(
        self,
        model_output: str,
        request: ChatCompletionRequest | ResponsesRequest,
    ) -> tuple[str | None, str | None]:
        reasoning, content = self._split(model_output, final=True)
        return reasoning or None, content or None

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        old_reasoning, old_content = self._split(previous_text, final=False)
        reasoning, content = self._split(current_text, final=False)
        reasoning, content = reasoning[len(old_reasoning):], content[len(old_content):]
        if not reasoning and not content:
            return None
        return DeltaMessage(reasoning=reasoning or None, content=content or None)
