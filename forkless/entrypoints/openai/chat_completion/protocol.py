"""vLLM's ``vllm.entrypoints.openai.chat_completion.protocol``: here the very module :mod:`forkless.protocol.openai`.

Parsers written for vLLM import their message types from here; after renaming ``vllm`` to
``forkless`` they get forkless's classes.
"""

import sys

import forkless.protocol.openai

sys.modules[__name__] = forkless.protocol.openai
