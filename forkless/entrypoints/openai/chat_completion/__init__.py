"""vLLM's ``vllm.entrypoints.openai.chat_completion`` package path (for parsers ported from vLLM)."""
