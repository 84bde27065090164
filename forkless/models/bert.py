"""BERT encoders (``BertModel``, ``BertForSequenceClassification``) for the pooling runner.

Invariants:
    * Attention is bidirectional over each sequence's tokens of the step, which always
      hold its whole prompt (the scheduler never chunks a pooling request). It never reads
      or writes the paged KV cache, so it does not depend on the attention backend: it
      runs torch's ``scaled_dot_product_attention`` over the step's sequences, padded to
      the longest one with a key mask (the linear layers see no padding).
    * Positions are absolute (learned embeddings); token types come from the request's
      ``PoolingParams.token_type_ids`` (0 when absent).
    * The linear layers stay torch's (oneDNN / MKL): a pooling step multiplies thousands of
      rows at once, where they are ~2x faster than forkless's packed CPU kernels, which
      are built for decode-sized batches (benchmarks/README.md, "Embeddings").
    * Parameter names are Hugging Face's except one fusion, ``attention.self.qkv``
      (query, key, value rows stacked), so one product computes all three.
    * With ``-tp N`` each rank holds 1/N of the attention heads (its rows of query, key
      and value) and of the intermediate layer (rows), and the matching columns of the two
      output projections, whose partial products an all-reduce sums before their (whole)
      bias is added once; embeddings, LayerNorms, the pooler and the classifier are
      replicated. Every rank then holds the same hidden states and pools alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from forkless.distributed.parallel_state import GroupCoordinator, get_tp_group
from forkless.models.hf_config import KVCacheSpec, kv_cache_spec
from forkless.models.layers.parallel import split_evenly
from forkless.models.weight_loading import FusedShard, TensorShard, load_named_weights
from forkless.pooling.config import num_labels_of
from forkless.pooling.interface import SupportsPooling

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from forkless.attention import AttentionBackend, AttentionMetadata

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


def _activation(config: "PretrainedConfig"):
    name = getattr(config, "hidden_act", "gelu")
    if name not in _ACTIVATIONS:
        raise ValueError(f"BERT hidden_act {name!r} is not supported ({', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


class BertEmbeddings(nn.Module):
    """Word + absolute position + token-type embeddings, then LayerNorm."""

    def __init__(self, config: "PretrainedConfig", dtype: torch.dtype) -> None:
        super().__init__()
        kind = getattr(config, "position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"BERT position_embedding_type {kind!r} is not supported (only 'absolute')")
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h, dtype=dtype)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h, dtype=dtype)
        self.token_type_embeddings = nn.Embedding(getattr(config, "type_vocab_size", 2), h, dtype=dtype)
        self.LayerNorm = nn.LayerNorm(h, eps=getattr(config, "layer_norm_eps", 1e-12), dtype=dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor | None) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class _Padding:
    """Where each token of the flattened batch sits in the ``[B, L_max]`` padded layout."""

    def __init__(self, starts: np.ndarray, device: torch.device) -> None:
        lens = np.diff(starts)
        self.batch = len(lens)
        self.max_len = int(lens.max())
        offsets = np.arange(int(starts[-1])) - np.repeat(starts[:-1], lens)
        index = np.repeat(np.arange(self.batch) * self.max_len, lens) + offsets
        self.index = torch.from_numpy(index.astype(np.int64)).to(device)
        mask = np.arange(self.max_len)[None, :] < lens[:, None]
        # [B, 1, 1, L]: every query of a sequence sees its own keys, none of the padding.
        self.mask = torch.from_numpy(mask).to(device)[:, None, None, :]
        self.uniform = bool((lens == self.max_len).all())


def _tp_group() -> GroupCoordinator | None:
    """The TP group when the model is split across ranks, else None (no collectives)."""
    group = get_tp_group()
    return group if group.world_size > 1 else None


class _RowParallelLinear(nn.Linear):
    """A linear layer whose input is split across the TP ranks (its weight's columns):
    the ranks' partial products are summed, then the whole bias is added once."""

    def __init__(self, in_features: int, out_features: int, group: GroupCoordinator | None,
                 dtype: torch.dtype) -> None:
        tp = 1 if group is None else group.world_size
        super().__init__(split_evenly(in_features, tp, "the layer's input width"), out_features, dtype=dtype)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return super().forward(x)
        return self.group.all_reduce(F.linear(x, self.weight)) + self.bias


class BertSelfAttention(nn.Module):
    """Bidirectional multi-head attention within each sequence of the step (this rank's heads)."""

    def __init__(self, config: "PretrainedConfig", dtype: torch.dtype) -> None:
        super().__init__()
        group = _tp_group()
        tp = 1 if group is None else group.world_size
        h = config.hidden_size
        self.head_dim = h // config.num_attention_heads
        self.num_heads = split_evenly(config.num_attention_heads, tp, "num_attention_heads")
        self.width = self.num_heads * self.head_dim  # this rank's share of the hidden size
        self.qkv = nn.Linear(h, 3 * self.width, dtype=dtype)

    def forward(self, x: torch.Tensor, pad: _Padding) -> torch.Tensor:
        width = self.width
        qkv = self.qkv(x)
        if pad.uniform:
            padded = qkv.view(pad.batch, pad.max_len, 3, self.num_heads, self.head_dim)
        else:
            padded = qkv.new_zeros((pad.batch * pad.max_len, 3 * width))
            padded.index_copy_(0, pad.index, qkv)
            padded = padded.view(pad.batch, pad.max_len, 3, self.num_heads, self.head_dim)
        q, k, v = padded.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, L, head_dim]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if pad.uniform else pad.mask)
        out = out.transpose(1, 2).reshape(pad.batch * pad.max_len, width)
        return out if pad.uniform else out.index_select(0, pad.index)


class BertLayer(nn.Module):
    """Post-norm attention block and feed-forward block (HF names: attention, intermediate, output)."""

    def __init__(self, config: "PretrainedConfig", dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = config.hidden_size, getattr(config, "layer_norm_eps", 1e-12)
        group = _tp_group()
        tp = 1 if group is None else group.world_size
        self.attention = nn.Module()
        self.attention.self = BertSelfAttention(config, dtype)
        self.attention.output = nn.Module()
        self.attention.output.dense = _RowParallelLinear(h, h, group, dtype)
        self.attention.output.LayerNorm = nn.LayerNorm(h, eps=eps, dtype=dtype)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(h, split_evenly(config.intermediate_size, tp, "intermediate_size"),
                                            dtype=dtype)
        self.output = nn.Module()
        self.output.dense = _RowParallelLinear(config.intermediate_size, h, group, dtype)
        self.output.LayerNorm = nn.LayerNorm(h, eps=eps, dtype=dtype)
        self.act = _activation(config)

    def forward(self, x: torch.Tensor, pad: _Padding) -> torch.Tensor:
        a = self.attention
        x = a.output.LayerNorm(a.output.dense(a.self(x, pad)) + x)
        y = self.output.dense(self.act(self.intermediate.dense(x)))
        return self.output.LayerNorm(y + x)


class _BertCore(nn.Module):
    """Embeddings and encoder layers (and the CLS pooler when a classifier needs it)."""

    def __init__(self, config: "PretrainedConfig", dtype: torch.dtype, with_pooler: bool) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(config, dtype)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(BertLayer(config, dtype) for _ in range(config.num_hidden_layers))
        if with_pooler:
            self.pooler = nn.Module()
            self.pooler.dense = nn.Linear(config.hidden_size, config.hidden_size, dtype=dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: "AttentionMetadata",
                token_type_ids: torch.Tensor | None) -> torch.Tensor:
        starts = attn_metadata.query_start_loc_cpu
        if starts is None:
            starts = attn_metadata.query_start_loc.cpu()
        pad = _Padding(starts.numpy(), input_ids.device)
        x = self.embeddings(input_ids, positions, token_type_ids)
        for layer in self.encoder.layer:
            x = layer(x, pad)
        return x


def _fused(width: int) -> dict[str, FusedShard]:
    """Query, key and value rows (``width`` each: this rank's heads) in the fused ``qkv``."""
    return {"query": FusedShard("qkv", 0, width), "key": FusedShard("qkv", width, width),
            "value": FusedShard("qkv", 2 * width, width)}


def _renamed(weights: Iterable[tuple[str, torch.Tensor]], prefix: str, drop: tuple[str, ...]):
    """Checkpoint names as this model's: old ``gamma``/``beta`` LayerNorm names, an optional
    ``bert.`` prefix, and heads this model does not have dropped."""
    for name, tensor in weights:
        if name.endswith(".gamma"):
            name = name[: -len("gamma")] + "weight"
        elif name.endswith(".beta"):
            name = name[: -len("beta")] + "bias"
        if prefix and not name.startswith(prefix) and not name.startswith("classifier."):
            name = prefix + name
        elif not prefix and name.startswith("bert."):
            name = name[len("bert."):]
        if name.startswith(drop) or name.endswith("position_ids"):
            continue
        yield name, tensor


class _BertBase(nn.Module, SupportsPooling):
    """What both BERT classes share: the encoder (under ``core_name``, the checkpoint's
    prefix) and the runner's entry points."""

    is_encoder: ClassVar[bool] = True
    takes_token_type_ids: ClassVar[bool] = True
    supports_tensor_parallel: ClassVar[bool] = True
    #: The encoder's attribute: ``bert`` in classifier checkpoints, none in ``BertModel`` ones.
    core_name: ClassVar[str] = "model"

    def __init__(self, hf_config: "PretrainedConfig", dtype: torch.dtype, with_pooler: bool) -> None:
        super().__init__()
        self.config = hf_config
        self.dtype = dtype
        setattr(self, self.core_name, _BertCore(hf_config, dtype, with_pooler=with_pooler))

    def _qkv_width(self) -> int:
        """Rows of query (and of key, of value) this rank holds."""
        return getattr(self, self.core_name).encoder.layer[0].attention.self.width

    def weight_shard(self, name: str, shape: tuple[int, ...]) -> TensorShard | None:
        """This TP rank's rows of query / key / value and of the intermediate layer (weights
        and biases), its columns of the two output projections' weights; the rest whole."""
        group = _tp_group()
        if group is None:
            return None
        rank, parts = group.rank_in_group, name.split(".")
        module, kind = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", "")
        if module in ("query", "key", "value"):
            width = self._qkv_width()
            return TensorShard(0, rank * width, width)
        if module == "dense" and len(parts) >= 3:
            owner = parts[-3]
            if owner == "intermediate":
                rows = split_evenly(self.config.intermediate_size, group.world_size, "intermediate_size")
                return TensorShard(0, rank * rows, rows)
            if owner == "output" and kind == "weight":
                # attention.output.dense reads the heads' outputs, output.dense the intermediate.
                cols = self._qkv_width() if parts[-4:-3] == ["attention"] else split_evenly(
                    self.config.intermediate_size, group.world_size, "intermediate_size")
                return TensorShard(1, rank * cols, cols)
        return None

    @classmethod
    def get_kv_cache_spec(cls, hf_config: "PretrainedConfig") -> KVCacheSpec:
        """The scheduler's blocks (the encoder itself never touches them)."""
        return kv_cache_spec(hf_config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: "AttentionMetadata", token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return getattr(self, self.core_name)(input_ids, positions, attn_metadata, token_type_ids)


class BertModel(_BertBase):
    """``BertModel``: the encoder whose hidden states the pooler reads (sentence-transformers).

    Args:
        hf_config: The model's Hugging Face config.
        dtype: Parameter and activation dtype.
        attn_backend: Unused: the encoder attends within the step (see the module).
    """

    def __init__(self, hf_config: "PretrainedConfig", dtype: torch.dtype,
                 attn_backend: "type[AttentionBackend] | None" = None) -> None:
        super().__init__(hf_config, dtype, with_pooler=False)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        named = ((f"model.{n}", t) for n, t in _renamed(weights, "", ("pooler.", "cls.", "classifier.")))
        return load_named_weights(self, named, _fused(self._qkv_width()))


class BertForSequenceClassification(_BertBase):
    """BERT with its CLS pooler and classifier head (cross-encoders, text classifiers).

    Args:
        hf_config: The model's Hugging Face config (``id2label`` / ``num_labels``).
        dtype: Parameter and activation dtype.
        attn_backend: Unused (see the module).
    """

    core_name: ClassVar[str] = "bert"

    def __init__(self, hf_config: "PretrainedConfig", dtype: torch.dtype,
                 attn_backend: "type[AttentionBackend] | None" = None) -> None:
        super().__init__(hf_config, dtype, with_pooler=True)
        self.num_labels = num_labels_of(hf_config)
        self.classifier = nn.Linear(hf_config.hidden_size, self.num_labels, dtype=dtype)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """BERT's head: ``classifier(tanh(pooler.dense(h_CLS)))``."""
        return self.classifier(torch.tanh(self.bert.pooler.dense(pooled)))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_named_weights(self, _renamed(weights, "bert.", ("cls.",)), _fused(self._qkv_width()))
