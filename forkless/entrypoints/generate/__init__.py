"""vLLM's ``vllm.entrypoints.generate`` package path (for parsers ported from vLLM)."""
