"""Causal LMs with a sequence-classification head (``*ForSequenceClassification``).

Invariants:
    * The decoder is the generative class unchanged; the checkpoint's ``score`` (``[labels,
      hidden]``, no bias) replaces the LM head, which such checkpoints do not have.
    * The pooling runner pools the last token (vLLM's default for these) and calls
      :meth:`classify` on it; nothing here samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import torch
from torch import nn

from forkless.models.llama import LlamaForCausalLM
from forkless.models.qwen2 import Qwen2ForCausalLM
from forkless.models.qwen3 import Qwen3ForCausalLM
from forkless.pooling.config import num_labels_of
from forkless.pooling.interface import SupportsPooling

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from forkless.attention import AttentionBackend


class _SequenceClassification(SupportsPooling):
    """Mixin over a causal LM class: drops the LM head, adds ``score``."""

    supports_lora = False
    # The decoder's own kernels and TP split (SupportsPooling comes first in the MRO and
    # says no); the score head is replicated on every rank (weight_shard keeps it whole).
    supports_cpu_kernels = True
    supports_tensor_parallel = True

    def _add_score(self, hf_config: "PretrainedConfig", dtype: torch.dtype) -> None:
        self.num_labels = num_labels_of(hf_config)
        self.score = nn.Linear(hf_config.hidden_size, self.num_labels, bias=False, dtype=dtype)
        # No LM head: the tied alias adds no parameter, and load_weights then skips the name.
        self.tie_word_embeddings = True
        self.lm_head = self.model.embed_tokens

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.score(pooled)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # ``score.weight`` is one of this model's parameters: the decoder's loader fills it
        # like the others, and names it when the checkpoint lacks it.
        return super().load_weights(weights)  # type: ignore[misc]


def _build(base: type) -> type:
    class Model(_SequenceClassification, base):  # type: ignore[misc, valid-type]
        def __init__(self, hf_config: "PretrainedConfig", dtype: torch.dtype,
                     attn_backend: "type[AttentionBackend]") -> None:
            base.__init__(self, hf_config, dtype, attn_backend)
            self._add_score(hf_config, dtype)

        def use_cpu_kernels(self) -> None:
            base.use_cpu_kernels(self)
            self.lm_head = self.model.embed_tokens  # no packed copy of a head that never runs

    Model.__name__ = Model.__qualname__ = base.__name__.replace("ForCausalLM", "ForSequenceClassification")
    Model.__doc__ = f"{base.__name__} with a ``score`` classifier head instead of the LM head."
    return Model


LlamaForSequenceClassification = _build(LlamaForCausalLM)
Qwen2ForSequenceClassification = _build(Qwen2ForCausalLM)
Qwen3ForSequenceClassification = _build(Qwen3ForCausalLM)
