"""vLLM's ``vllm.entrypoints.openai.responses.protocol``, for the type hints of ported parsers.

forkless serves no Responses API; see :class:`forkless.protocol.openai.ResponsesRequest`.
"""

from forkless.protocol.openai import ResponsesRequest

__all__ = ["ResponsesRequest"]
