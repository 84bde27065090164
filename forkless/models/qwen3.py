"""Qwen3 (dense): the Llama architecture with per-head RMSNorm on queries and keys."""

from __future__ import annotations

from typing import TYPE_CHECKING

from forkless.models.llama import AttentionOptions, LlamaForCausalLM

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 causal LM (same constructor and interface as :class:`LlamaForCausalLM`)."""

    @classmethod
    def attention_options(cls, hf_config: "PretrainedConfig") -> AttentionOptions:
        bias = bool(getattr(hf_config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, o_bias=bias, qk_norm=True)
