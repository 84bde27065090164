"""vLLM's ``vllm.v1.metrics`` package path (see :mod:`forkless.v1`)."""
