"""Qwen2 / Qwen2.5: the Llama architecture with biases on the q/k/v projections."""

from __future__ import annotations

from typing import TYPE_CHECKING

from forkless.models.llama import AttentionOptions, LlamaForCausalLM

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 causal LM (same constructor and interface as :class:`LlamaForCausalLM`)."""

    @classmethod
    def attention_options(cls, hf_config: "PretrainedConfig") -> AttentionOptions:
        return AttentionOptions(qkv_bias=True, o_bias=False, qk_norm=False)
