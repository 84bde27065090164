"""Llama (and Mistral, and the base of Qwen2/Qwen3) for batched serving over a paged KV cache.

Parameter names mirror the Hugging Face checkpoint layout except for two fusions that
save matmul launches: ``self_attn.qkv_proj`` (q, k, v rows stacked) and
``mlp.gate_up_proj`` (gate rows, then up rows). :meth:`LlamaForCausalLM.load_weights`
splits checkpoint tensors into them.

Tensor parallelism (``-tp N``, see :mod:`forkless.models.layers.parallel`): each rank
builds the same modules with its share of the sizes -- its query and KV heads in
``qkv_proj``, its rows of ``gate_up_proj``, the matching columns of ``o_proj`` and
``down_proj``, its rows of the vocabulary -- and all-reduces after ``o_proj``, the MLP
and the embedding, and all-gathers the logits. With one rank none of that exists: the
layers are built at full size and no collective runs (``tp_group`` is None).

Pipeline parallelism (``-pp N``): stage ``p`` builds only its layers (the others are
:class:`PPMissingLayer`, holding nothing), the first stage the embedding, the last the
final norm and the head; a stage receives the hidden states and the residual stream of the
one before (one ``[2, tokens, hidden]`` tensor) and sends its own on; the last stage's
logits are broadcast to the others, so every rank samples the same tokens. Stages run one
after the other within a step (no micro-batches in flight yet).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from forkless.distributed.parallel_state import GroupCoordinator, get_pp_group, get_tp_group
from forkless.logger import init_logger
from forkless.models.hf_config import get_head_dim, get_num_kv_heads, get_rope_parameters
from forkless.models.interface import CausalLMBase
from forkless.models.layers.cpu_decode_stack import CpuDecodeStack
from forkless.models.layers.cpu_linear import CPULinear, cpu_linear_for, pack_linear_layers
from forkless.models.layers.cuda_gemv import GemvLinear
from forkless.models.layers.mlp import SwiGLUMLP
from forkless.models.layers.norm import RMSNorm
from forkless.models.layers.parallel import (
    PPMissingLayer,
    VocabParallelEmbedding,
    kv_head_index,
    kv_heads_per_rank,
    pp_layer_range,
    split_evenly,
    vocab_per_rank,
)
from forkless.models.layers.rotary import RotaryEmbedding
from forkless.models.weight_loading import FusedShard, TensorShard, load_named_weights

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from forkless.attention import AttentionBackend, AttentionMetadata

logger = init_logger(__name__)

# Vocabulary rows per LM-head product on CPU (see LlamaForCausalLM.compute_logits).
_CPU_LOGITS_SLICE = 1024


def _tp_group() -> GroupCoordinator | None:
    """The TP group when the model is split across ranks, else None (no collectives)."""
    group = get_tp_group()
    return group if group.world_size > 1 else None


def _pp_group() -> GroupCoordinator | None:
    """The PP group when the layers are split into stages, else None."""
    group = get_pp_group()
    return group if group.world_size > 1 else None


@dataclass(frozen=True)
class AttentionOptions:
    """Where the Llama-family architectures differ in their attention block."""

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False


class LlamaAttention(nn.Module):
    """Grouped-query self-attention with rotary embeddings over the paged cache."""

    def __init__(
        self,
        config: "PretrainedConfig",
        layer_idx: int,
        dtype: torch.dtype,
        attn_backend: "type[AttentionBackend]",
        options: AttentionOptions,
    ) -> None:
        super().__init__()
        self.tp_group = _tp_group()
        tp = 1 if self.tp_group is None else self.tp_group.world_size
        # This rank's heads (all of them with one rank).
        self.num_heads = split_evenly(config.num_attention_heads, tp, "num_attention_heads")
        self.num_kv_heads = kv_heads_per_rank(get_num_kv_heads(config), tp)
        self.head_dim = get_head_dim(config)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        hidden = config.hidden_size
        self.qkv_proj = nn.Linear(
            hidden, self.q_size + 2 * self.kv_size, bias=options.qkv_bias, dtype=dtype
        )
        self.o_proj = nn.Linear(self.q_size, hidden, bias=options.o_bias, dtype=dtype)
        self.qk_norm = options.qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype=dtype)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype=dtype)
        self.rotary_emb = RotaryEmbedding(self.head_dim, get_rope_parameters(config))
        self.attn = attn_backend(
            self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5, layer_idx
        )

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        kv_cache: torch.Tensor | None,
        attn_metadata: "AttentionMetadata",
    ) -> torch.Tensor:
        num_tokens = hidden_states.shape[0]
        q, k, v = self.qkv_proj(hidden_states).split(
            [self.q_size, self.kv_size, self.kv_size], dim=-1
        )
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        # On CUDA the rotary kernel also stores the new keys and values where the backend
        # lets it: one launch fewer a layer.
        store = self.attn.kv_store_target(kv_cache, attn_metadata)
        norms = (self.q_norm, self.k_norm) if self.qk_norm else (None, None)
        if store is not None and self.rotary_emb.rotate_and_store(positions, q, k, v, store, *norms):
            out = self.attn.forward_stored(q, store.cache, attn_metadata)
        else:
            if self.qk_norm:
                q, k = self.rotary_emb.rotate_normed(positions, q, k, self.q_norm, self.k_norm)
            else:
                q, k = self.rotary_emb(positions, q, k)
            out = self.attn.forward(q, k, v, kv_cache, attn_metadata)
        if self.tp_group is None:
            return self.o_proj(out)
        return self.tp_group.all_reduce(self.o_proj(out))  # partial sums of o_proj's columns


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention + SwiGLU block; the residual stream is carried between layers."""

    def __init__(
        self,
        config: "PretrainedConfig",
        layer_idx: int,
        dtype: torch.dtype,
        attn_backend: "type[AttentionBackend]",
        options: AttentionOptions,
    ) -> None:
        super().__init__()
        self.tp_group = _tp_group()
        self.self_attn = LlamaAttention(config, layer_idx, dtype, attn_backend, options)
        self.mlp = SwiGLUMLP(
            config.hidden_size,
            split_evenly(config.intermediate_size, 1 if self.tp_group is None else self.tp_group.world_size,
                         "intermediate_size"),
            bias=bool(getattr(config, "mlp_bias", False)),
            dtype=dtype,
        )
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: torch.Tensor | None,
        attn_metadata: "AttentionMetadata",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, kv_cache, attn_metadata)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        if self.tp_group is None:
            return self.mlp(hidden_states), residual
        return self.tp_group.all_reduce(self.mlp(hidden_states)), residual  # down_proj's partial sums


class LlamaModel(nn.Module):
    """Embeddings, decoder layers and the final norm."""

    def __init__(
        self,
        config: "PretrainedConfig",
        dtype: torch.dtype,
        attn_backend: "type[AttentionBackend]",
        options: AttentionOptions,
    ) -> None:
        super().__init__()
        group = _tp_group()
        self.pp_group = _pp_group()
        pp = self.pp_group
        self.start_layer, self.end_layer = (0, config.num_hidden_layers) if pp is None else pp_layer_range(
            config.num_hidden_layers, pp.world_size, pp.rank_in_group)
        self.hidden_size, self.dtype = config.hidden_size, dtype
        if pp is not None and not pp.is_first_rank:
            self.embed_tokens = PPMissingLayer()
        elif group is None:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        else:
            self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, group, dtype=dtype)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, dtype, attn_backend, options)
            if self.start_layer <= i < self.end_layer else PPMissingLayer()
            for i in range(config.num_hidden_layers)
        )
        # Every layer rotates by the same table: one shared module computes a step's
        # cos/sin once instead of once per layer (it holds no checkpoint weights).
        own = self.layers[self.start_layer:self.end_layer]
        for layer in own[1:]:
            layer.self_attn.rotary_emb = own[0].self_attn.rotary_emb
        last = pp is None or pp.is_last_rank
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype) if last else PPMissingLayer()
        # Decode steps in one C call on the CPU (set by LlamaForCausalLM.use_cpu_kernels).
        self.cpu_decode_stack: CpuDecodeStack | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: "AttentionMetadata",
    ) -> torch.Tensor:
        pp = self.pp_group
        if pp is None:
            if self.cpu_decode_stack is not None:
                out = self.cpu_decode_stack.forward(self, input_ids, positions, kv_caches, attn_metadata)
                if out is not None:
                    return out
            hidden_states = self.embed_tokens(input_ids)
            residual = None
            for i, layer in enumerate(self.layers):
                # No caches at all is a profiling run: attention then sees only new tokens.
                kv_cache = kv_caches[i] if kv_caches else None
                hidden_states, residual = layer(positions, hidden_states, residual, kv_cache, attn_metadata)
            hidden_states, _ = self.norm(hidden_states, residual)
            return hidden_states
        if pp.is_first_rank:
            hidden_states, residual = self.embed_tokens(input_ids), None
        else:  # the previous stage's hidden states and residual stream
            both = pp.recv((2, input_ids.shape[0], self.hidden_size), self.dtype)
            hidden_states, residual = both[0], both[1]
        for i in range(self.start_layer, self.end_layer):
            # This stage caches its own layers only: cache j is layer start_layer + j.
            kv_cache = kv_caches[i - self.start_layer] if kv_caches else None
            hidden_states, residual = self.layers[i](positions, hidden_states, residual, kv_cache, attn_metadata)
        if not pp.is_last_rank:
            pp.send(torch.stack([hidden_states, residual]))
            return hidden_states  # not final: the last stage's logits are what count
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


def _check_supported(config: "PretrainedConfig") -> None:
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{type(config).__name__}: hidden_act {act!r} is not supported (only 'silu')")
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and window < config.max_position_embeddings:
        logger.warning(
            "sliding_window=%d is not implemented: attention spans the whole sequence, so "
            "outputs past %d tokens differ from the reference model",
            window, window,
        )


class LlamaForCausalLM(CausalLMBase):
    """Llama / Llama-2 / Llama-3.x / Mistral causal LM.

    Args:
        hf_config: The model's Hugging Face config.
        dtype: Parameter and activation dtype.
        attn_backend: Attention backend class, instantiated once per layer.
    """

    def __init__(
        self,
        hf_config: "PretrainedConfig",
        dtype: torch.dtype,
        attn_backend: "type[AttentionBackend]",
    ) -> None:
        super().__init__(hf_config, dtype, attn_backend)
        _check_supported(hf_config)
        self.model = LlamaModel(hf_config, dtype, attn_backend, self.attention_options(hf_config))
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.tp_group = _tp_group()
        self.pp_group = _pp_group()
        if self.pp_group is not None and not self.pp_group.is_last_rank:
            self.lm_head = PPMissingLayer()
        elif self.tie_word_embeddings and (self.pp_group is None or self.pp_group.is_first_rank):
            self.lm_head = self.model.embed_tokens
        elif self.tie_word_embeddings:  # the last stage's copy of the first stage's embedding
            self.lm_head = (nn.Embedding(hf_config.vocab_size, hf_config.hidden_size, dtype=dtype)
                            if self.tp_group is None else VocabParallelEmbedding(
                                hf_config.vocab_size, hf_config.hidden_size, self.tp_group, dtype=dtype))
        else:
            rows = hf_config.vocab_size if self.tp_group is None else vocab_per_rank(
                hf_config.vocab_size, self.tp_group.world_size)
            self.lm_head = nn.Linear(hf_config.hidden_size, rows, bias=False, dtype=dtype)

    @classmethod
    def attention_options(cls, hf_config: "PretrainedConfig") -> AttentionOptions:
        """The attention-block variant this architecture uses."""
        bias = bool(getattr(hf_config, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, o_bias=bias, qk_norm=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: "AttentionMetadata",
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    supports_cpu_kernels = True
    supports_lora = True
    supports_tensor_parallel = True
    supports_pipeline_parallel = True

    def lora_modules(self) -> dict[str, list[tuple[str, int]]]:
        cfg = self.config
        # The checkpoint's whole widths (this rank's share of them: LoRAModelManager asks weight_shard).
        q_size = cfg.num_attention_heads * self.head_dim
        kv_size = get_num_kv_heads(cfg) * self.head_dim
        inter = cfg.intermediate_size
        hidden = cfg.hidden_size
        out: dict[str, list[tuple[str, int]]] = {}
        for i in range(self.start_layer, self.end_layer):  # this pipeline stage's layers
            attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
            out[f"{attn}.qkv_proj"] = [(f"{attn}.q_proj", q_size), (f"{attn}.k_proj", kv_size),
                                       (f"{attn}.v_proj", kv_size)]
            out[f"{attn}.o_proj"] = [(f"{attn}.o_proj", hidden)]
            out[f"{mlp}.gate_up_proj"] = [(f"{mlp}.gate_proj", inter), (f"{mlp}.up_proj", inter)]
            out[f"{mlp}.down_proj"] = [(f"{mlp}.down_proj", hidden)]
        return out

    def use_cpu_kernels(self) -> None:
        """Run every linear layer and the LM head on weights packed for the CPU.

        The model runner calls this on the CPU for float32 (forkless's C kernels) and
        bfloat16 (oneDNN) where they are available. A tied head gets its own packed copy:
        the embedding still needs its rows.
        """
        pack_linear_layers(self)
        if self.tie_word_embeddings and not isinstance(self.lm_head, PPMissingLayer):
            self.lm_head = cpu_linear_for(self.lm_head.weight)
        if CpuDecodeStack.applies_to(self.model):
            self.model.cpu_decode_stack = CpuDecodeStack()

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        pp = self.pp_group
        if pp is not None and not pp.is_last_rank:  # the model runner samples on the last stage only
            raise RuntimeError(f"compute_logits on pipeline stage {pp.rank_in_group} of {pp.world_size}: "
                               "only the last stage has the final norm's output and the LM head")
        return self._tp_logits(hidden_states)

    def _tp_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The logits of every vocabulary row (gathered from the TP ranks)."""
        if self.tp_group is None:
            return self._head_logits(hidden_states)
        # Every rank gets the whole vocabulary's logits (and samples the same tokens).
        logits = self.tp_group.all_gather(self._head_logits(hidden_states), dim=-1)
        vocab = self.config.vocab_size
        return logits if logits.shape[-1] == vocab else logits[:, :vocab].contiguous()

    def _head_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """This rank's vocabulary rows' logits (all of them with one rank)."""
        if isinstance(self.lm_head, (CPULinear, GemvLinear)):
            return self.lm_head(hidden_states)
        weight = self.lm_head.weight
        if hidden_states.device.type == "cpu" and hidden_states.shape[0] > 1:
            # One [rows, vocab] product streams its output past the CPU cache; in vocabulary
            # slices each output block stays in cache (~40 -> ~55 GFLOP/s at 64 rows on a
            # 2-core EPYC). Every logit is still one dot product: the same values.
            return torch.cat([F.linear(hidden_states, w) for w in weight.split(_CPU_LOGITS_SLICE)], dim=1)
        return F.linear(hidden_states, weight)

    def _rank_sizes(self) -> tuple[int, int, int]:
        """This rank's ``(q rows, k or v rows, gate or up rows)``: all of them with one rank."""
        cfg, tp = self.config, self.tensor_parallel_size
        return (cfg.num_attention_heads // tp * self.head_dim, self.num_kv_heads * self.head_dim,
                cfg.intermediate_size // tp)

    def weight_shard(self, name: str, shape: tuple[int, ...]) -> TensorShard | None:
        """Column-parallel q/k/v and gate/up (rows), row-parallel o/down (columns; their
        biases whole), the vocabulary by rows; norms whole."""
        tp, rank = self.tensor_parallel_size, self.tensor_parallel_rank
        if self.pipeline_parallel_size > 1 and self._stage_name(name) is None:
            return TensorShard(0, 0, 0)  # another stage's: nothing of it is read
        if tp == 1:
            return None
        parts = name.split(".")
        module, kind = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", "")
        q_rows, kv_rows, inter_rows = self._rank_sizes()
        if module == "q_proj":
            return TensorShard(0, rank * q_rows, q_rows)
        if module in ("k_proj", "v_proj"):
            total_kv = get_num_kv_heads(self.config)
            return TensorShard(0, kv_head_index(total_kv, tp, rank) * self.head_dim, kv_rows)
        if module in ("gate_proj", "up_proj"):
            return TensorShard(0, rank * inter_rows, inter_rows)
        if module in ("o_proj", "down_proj") and kind == "weight":
            cols = q_rows if module == "o_proj" else inter_rows
            return TensorShard(1, rank * cols, cols)
        if module in ("embed_tokens", "lm_head"):
            per_rank = vocab_per_rank(self.config.vocab_size, tp)
            start = min(rank * per_rank, shape[0])
            return TensorShard(0, start, max(0, min(per_rank, shape[0] - start)))
        return None

    def _stage_name(self, name: str) -> str | None:
        """Where checkpoint tensor ``name`` goes on this pipeline stage (its own name, or
        ``lm_head.weight`` for a tied embedding on the last stage), or None: not here."""
        first, last = self.pipeline_parallel_rank == 0, self.pipeline_parallel_rank == self.pipeline_parallel_size - 1
        if name.startswith("model.layers."):
            return name if self.start_layer <= int(name.split(".")[2]) < self.end_layer else None
        if name.startswith("model.embed_tokens."):
            if first:
                return name
            return "lm_head." + name.split(".")[-1] if last and self.tie_word_embeddings else None
        if name.startswith("model.norm."):
            return name if last else None
        if name.startswith("lm_head."):
            return name if last and not self.tie_word_embeddings else None
        return name

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        q_size, kv_size, inter = self._rank_sizes()
        fused = {
            "q_proj": FusedShard("qkv_proj", 0, q_size),
            "k_proj": FusedShard("qkv_proj", q_size, kv_size),
            "v_proj": FusedShard("qkv_proj", q_size + kv_size, kv_size),
            "gate_proj": FusedShard("gate_up_proj", 0, inter),
            "up_proj": FusedShard("gate_up_proj", inter, inter),
        }
        # A tied head is the embedding itself; some tied checkpoints still store a copy.
        skip = ("rotary_emb.inv_freq", "lm_head.weight") if self.tie_word_embeddings else (
            "rotary_emb.inv_freq",
        )
        if self.tensor_parallel_size == 1 and self.pipeline_parallel_size == 1:
            return load_named_weights(self, weights, fused, skip)
        if self.pipeline_parallel_size > 1:  # this stage's tensors only (a tied head: its copy)
            weights = ((target, t) for name, t in weights if (target := self._stage_name(name)) is not None)
            skip = ("rotary_emb.inv_freq",)
        loaded = load_named_weights(self, weights, fused, skip,
                                    padded=("model.embed_tokens.weight", "lm_head.weight"))
        if self.tensor_parallel_rank != 0:
            # Row-parallel biases are added once, after the all-reduce sums the ranks' outputs.
            for name, param in self.named_parameters():
                if name.endswith(("o_proj.bias", "down_proj.bias")):
                    param.data.zero_()
        return loaded
