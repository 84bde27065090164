"""vLLM's ``vllm.entrypoints.openai.responses.protocol``, for the type hints of ported parsers.

forkless serves no Responses API, so parsers only ever receive a ``ChatCompletionRequest``;
``ResponsesRequest`` exists so that a signature written for vLLM
(``request: ChatCompletionRequest | ResponsesRequest``) imports and evaluates.
"""

from forkless.protocol.openai import OpenAIModel


class ResponsesRequest(OpenAIModel):
    """A placeholder: no forkless endpoint creates one."""


__all__ = ["ResponsesRequest"]
