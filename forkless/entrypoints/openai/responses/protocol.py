"""vLLM's ``vllm.entrypoints.openai.responses.protocol``, for the type hints of ported parsers.

The request is :class:`forkless.protocol.openai.ResponsesRequest`; the Responses API is
served by :mod:`forkless.entrypoints.openai.serving_responses`.
"""

from forkless.protocol.openai import ResponsesRequest

__all__ = ["ResponsesRequest"]
