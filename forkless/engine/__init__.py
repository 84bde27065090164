"""The engine: input processing, the engine core loop, output processing.

``FinishReason`` is here as in vLLM (``vllm.v1.engine``, which names this package), for
stat loggers that compare a finished request's ``finish_reason`` with it.
"""

from forkless.protocol.step import FinishReason

__all__ = ["FinishReason"]
