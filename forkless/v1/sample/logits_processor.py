"""vLLM's ``vllm.v1.sample.logits_processor``: here the very package
:mod:`forkless.logits_processors` (``LogitsProcessor``, ``BatchUpdate``,
``MoveDirectionality``, the built-ins)."""

import sys

import forkless.logits_processors

sys.modules[__name__] = forkless.logits_processors
