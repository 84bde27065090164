"""vLLM's ``vllm.entrypoints.generate.base`` package path (for parsers ported from vLLM)."""
