"""vLLM's ``vllm.v1.attention.selector`` path, for the selector config a ported platform's
``get_attn_backend_cls`` annotates with (defined in :mod:`forkless.platforms.interface`)."""

from forkless.platforms.interface import AttentionSelectorConfig

__all__ = ["AttentionSelectorConfig"]
