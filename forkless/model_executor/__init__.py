"""vLLM's ``vllm.model_executor`` package path: ``.models`` is :mod:`forkless.models` and
``.custom_op`` is :mod:`forkless.ops.interface` (see :mod:`forkless.module_aliases`)."""
