"""vLLM's ``vllm.entrypoints.openai.responses`` package path (for parsers ported from vLLM)."""
