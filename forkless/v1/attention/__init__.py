"""vLLM's ``vllm.v1.attention`` package path (see :mod:`forkless.v1`)."""
