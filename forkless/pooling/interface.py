"""What a model declares so that the pooling runner can use it beyond its hidden states.

A causal LM served with ``--convert embed`` needs nothing of this: the runner pools the
hidden states its ``forward`` returns. Encoders and sequence-classification models
subclass :class:`SupportsPooling` to declare what differs.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from forkless.plugins import Stability, stability


@stability(Stability.PROVISIONAL)
class SupportsPooling:
    """Capabilities of a model that the pooling runner reads (all with defaults).

    Attributes:
        is_encoder: Attention is bidirectional: the model attends over the step's tokens
            of each sequence itself, never over the KV cache (so a prompt must run whole,
            which the scheduler does for every pooling request).
        takes_token_type_ids: ``forward`` takes ``token_type_ids=`` (``[T]`` int64
            segment ids, BERT's token types).
        num_labels: Outputs of the classifier head; 0: no head.
        supports_cpu_kernels: Whether :meth:`use_cpu_kernels` moves the model's linear
            layers onto weights packed for the CPU (float32: forkless's C kernels;
            bfloat16: oneDNN).
        supports_tensor_parallel: Whether the model splits its layers across ``-tp``
            ranks; it then has ``weight_shard(name, shape)`` as ``CausalLMBase`` does
            (the part of each checkpoint tensor a rank reads), and every rank ends a
            forward pass with the same hidden states.
    """

    is_encoder: ClassVar[bool] = False
    takes_token_type_ids: ClassVar[bool] = False
    supports_cpu_kernels: ClassVar[bool] = False
    supports_tensor_parallel: ClassVar[bool] = False
    num_labels: int = 0

    def use_cpu_kernels(self) -> None:
        """Switch the linear layers to weights packed for the CPU (see
        :attr:`supports_cpu_kernels`)."""
        raise NotImplementedError(f"{type(self).__qualname__} declares no CPU-kernel support")

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """Classifier logits of pooled hidden states.

        Args:
            pooled: ``[N, hidden_size]``, one pooled row per request.

        Returns:
            ``[N, num_labels]`` logits.
        """
        raise NotImplementedError(f"{type(self).__qualname__} has no classifier head")
