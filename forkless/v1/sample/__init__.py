"""vLLM's ``vllm.v1.sample`` package path (see :mod:`forkless.v1`)."""
