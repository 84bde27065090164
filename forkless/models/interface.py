"""The contract between the model runner and a model class (built-in or from a plugin).

A class registered with ``ModelRegistry.register_model(arch, "pkg.mod:Class")`` is
expected to subclass :class:`CausalLMBase` (or at least provide the same members). The
runner relies on exactly this:

- ``cls(hf_config, dtype, attn_backend)`` builds the model; parameters are created on
  the current default device (the loader wraps construction in ``with torch.device(...)``).
- ``cls.get_kv_cache_spec(hf_config)`` sizes the paged KV cache before the model exists;
  each layer's cache is one tensor of ``attn_backend.get_kv_cache_shape(...)``.
- ``model.forward(input_ids, positions, kv_caches, attn_metadata)`` runs the decoder
  over a flattened batch and returns hidden states; ``model.compute_logits(hidden)``
  turns the rows the sampler needs into logits (in the model's dtype; the sampler casts).
- ``model.load_weights(weights)`` takes Hugging Face parameter names.
- With ``-tp N`` (``supports_tensor_parallel``), the model is built in each of the N
  ranks, holding its share of every layer (``tensor_parallel_size``/``_rank`` come from
  ``forkless.distributed.parallel_state.get_tp_group()``); ``model.weight_shard(name,
  shape)`` tells the loader which part of each checkpoint tensor the rank reads, and
  ``num_kv_heads`` is the rank's own (its KV cache holds only those heads).
- With ``--enable-lora``, ``model.lora_modules()`` (when ``supports_lora``) names the
  linear layers LoRA adapters apply to; the runner wraps them (``forkless.lora``).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar, Iterable

import torch
from torch import nn

from forkless.distributed.parallel_state import get_pp_group, get_tp_group
from forkless.models.hf_config import KVCacheSpec, kv_cache_spec
from forkless.models.layers.parallel import kv_heads_per_rank, pp_layer_range
from forkless.models.weight_loading import TensorShard
from forkless.plugins import Stability, stability

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from forkless.attention import AttentionBackend, AttentionMetadata


@stability(Stability.PUBLIC)
class CausalLMBase(nn.Module, abc.ABC):
    """A decoder-only language model served over the paged KV cache.

    Args:
        hf_config: The model's Hugging Face config (``transformers.PretrainedConfig``).
        dtype: Parameter and activation dtype.
        attn_backend: The attention backend class; the model builds one instance per
            attention layer: ``attn_backend(num_heads, num_kv_heads, head_dim, scale,
            layer_idx)``.
    """

    #: Whether :meth:`use_cpu_kernels` moves the model's linear layers onto weights packed
    #: for the CPU (forkless's C kernels in float32, oneDNN in bfloat16).
    supports_cpu_kernels: ClassVar[bool] = False
    #: Whether :meth:`lora_modules` maps LoRA adapters onto this model's layers.
    supports_lora: ClassVar[bool] = False
    #: Whether the model splits its layers across ``-tp`` ranks (:meth:`weight_shard`).
    supports_tensor_parallel: ClassVar[bool] = False
    #: Whether the model runs only its stage's layers under ``-pp`` (sending the hidden
    #: states on, and sharing the last stage's logits).
    supports_pipeline_parallel: ClassVar[bool] = False

    def __init__(
        self,
        hf_config: "PretrainedConfig",
        dtype: torch.dtype,
        attn_backend: "type[AttentionBackend]",
    ) -> None:
        super().__init__()
        self.config = hf_config
        self.dtype = dtype
        spec = self.get_kv_cache_spec(hf_config)
        pp = get_pp_group()
        #: Pipeline stages, this one's place among them, and its layers ``[start, end)``.
        self.pipeline_parallel_size = pp.world_size
        self.pipeline_parallel_rank = pp.rank_in_group
        self.start_layer, self.end_layer = (0, spec.num_layers) if pp.world_size == 1 else pp_layer_range(
            spec.num_layers, pp.world_size, pp.rank_in_group)
        #: Layers whose KV this rank caches (all of them without pipeline parallelism).
        self.num_layers = self.end_layer - self.start_layer
        tp = get_tp_group()
        #: Ranks the layers are split across, and this one's place among them.
        self.tensor_parallel_size = tp.world_size
        self.tensor_parallel_rank = tp.rank_in_group
        #: KV heads this rank caches (all of them without tensor parallelism).
        self.num_kv_heads = spec.num_kv_heads if tp.world_size == 1 else kv_heads_per_rank(
            spec.num_kv_heads, tp.world_size)
        self.head_dim = spec.head_dim

    def weight_shard(self, name: str, shape: tuple[int, ...]) -> TensorShard | None:
        """The part of checkpoint tensor ``name`` this tensor-parallel rank reads.

        Args:
            name: The checkpoint (Hugging Face) name.
            shape: The tensor's full shape in the checkpoint.

        Returns:
            A :class:`forkless.models.weight_loading.TensorShard`, or None for the whole
            tensor (replicated parameters, and every tensor without tensor parallelism).
        """
        return None

    @classmethod
    def get_kv_cache_spec(cls, hf_config: "PretrainedConfig") -> KVCacheSpec:
        """KV-cache dimensions, available without building the model.

        Args:
            hf_config: The model's Hugging Face config.

        Returns:
            ``KVCacheSpec(num_layers, num_kv_heads, head_dim)``: one cache tensor per
            layer, each holding ``num_kv_heads`` heads of ``head_dim`` per token.
        """
        return kv_cache_spec(hf_config)

    def use_cpu_kernels(self) -> None:
        """Switch the linear layers to weights packed for the CPU
        (:func:`forkless.models.layers.cpu_linear.pack_linear_layers`).

        The model runner calls it once, after loading weights, when
        :attr:`supports_cpu_kernels` is true and the CPU has a packed layer for the dtype
        (float32: forkless's C kernels built; bfloat16: oneDNN's bfloat16 matmul).
        """
        raise NotImplementedError(f"{type(self).__qualname__} declares no CPU-kernel support")

    def lora_modules(self) -> dict[str, list[tuple[str, int]]]:
        """The linear layers LoRA adapters apply to, and the checkpoint modules in each.

        A fused layer lists the checkpoint projections stacked in its output, in order
        (``qkv_proj``: ``q_proj``, ``k_proj``, ``v_proj``); the runner gives each its own
        adapter weights. Called after :meth:`use_cpu_kernels`, so a layer may be any module
        mapping ``[T, in_features]`` to ``[T, out_features]``.

        Returns:
            This model's module path (``model.layers.0.self_attn.qkv_proj``) -> one
            ``(checkpoint module name, output width)`` per stacked projection, e.g.
            ``("model.layers.0.self_attn.q_proj", 2048)``.
        """
        raise NotImplementedError(f"{type(self).__qualname__} declares no LoRA support")

    @abc.abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: "AttentionMetadata",
    ) -> torch.Tensor:
        """Run the decoder over a flattened batch of new tokens.

        Args:
            input_ids: ``[T]`` int64 token ids of every sequence's new tokens, concatenated.
            positions: ``[T]`` int64 position of each token within its sequence.
            kv_caches: One cache tensor per layer (``num_layers`` of them); the new
                tokens' keys and values are written into them.
            attn_metadata: Batch layout (see :class:`forkless.attention.AttentionMetadata`).

        Returns:
            ``[T, hidden_size]`` final hidden states (after the last norm).
        """

    @abc.abstractmethod
    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Project hidden states to vocabulary logits.

        Args:
            hidden_states: ``[N, hidden_size]``, typically the last row of each sequence.

        Returns:
            ``[N, vocab_size]`` logits in the model's dtype (as vLLM's): the sampler casts
            them to float32 where it computes with them, and takes a greedy batch's argmax
            in the dtype they come in.
        """

    @abc.abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into the model.

        Args:
            weights: ``(hugging_face_name, tensor)`` pairs, e.g.
                ``("model.layers.0.self_attn.q_proj.weight", t)``.

        Returns:
            The names of this model's parameters that were loaded.

        Raises:
            ValueError: A parameter received no weight, or a tensor's shape mismatches.
        """
