"""vLLM's ``vllm.entrypoints.openai.engine`` package path (for parsers ported from vLLM)."""
