"""vLLM's ``vllm.entrypoints.generate.base.protocol`` (where vLLM keeps ``DeltaMessage``,
``DeltaToolCall``, ``ExtractedToolCallInformation``... since 0.31): here the very module
:mod:`forkless.protocol.openai`."""

import sys

import forkless.protocol.openai

sys.modules[__name__] = forkless.protocol.openai
