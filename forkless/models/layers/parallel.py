"""Tensor-parallel pieces of the Llama-family layers (``-tp N``).

Facts the layers rely on (as vLLM's column / row / vocabulary-parallel layers):
    * A column-parallel linear keeps rows ``[r * n / N, (r + 1) * n / N)`` of its weight
      (output features); its output needs no communication.
    * A row-parallel linear keeps the matching columns (input features); the ranks'
      outputs are partial sums, added up by one all-reduce. Its bias is added once (rank
      0 keeps it, the others hold zeros).
    * The vocabulary is split into ``ceil(vocab / N)`` rows per rank, the last rank's
      padded with zero rows; an embedding looks up the ids it holds (zeros for the
      others) and all-reduces; the LM head's per-rank logits are all-gathered and the
      padding cut off, so every rank samples from the same full logits.
    * With fewer KV heads than ranks, each rank keeps one KV head, shared by the ranks
      whose query heads attend to it (``N / num_kv_heads`` of them).

The linear layers themselves stay ``nn.Linear`` (so the CPU kernels pack them and the
CUDA path is the same): only their sizes differ, and the model adds the collectives.
"""

from __future__ import annotations

import torch
from torch import nn

from forkless.distributed.parallel_state import GroupCoordinator


def split_evenly(total: int, parts: int, what: str) -> int:
    """``total / parts``.

    Raises:
        ValueError: ``total`` does not split into ``parts`` equal parts (the message names
            ``what``).
    """
    if total % parts:
        raise ValueError(f"{what} ({total}) does not split into {parts} tensor-parallel ranks")
    return total // parts


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads one rank caches: its share, or one replicated head when ranks outnumber them.

    Raises:
        ValueError: Neither count divides the other.
    """
    if tp_size <= num_kv_heads:
        return split_evenly(num_kv_heads, tp_size, "num_key_value_heads")
    split_evenly(tp_size, num_kv_heads, "the tensor-parallel size (more ranks than KV heads)")
    return 1


def kv_head_index(num_kv_heads: int, tp_size: int, tp_rank: int) -> int:
    """The first KV head (of the checkpoint's) that rank ``tp_rank`` holds."""
    if tp_size <= num_kv_heads:
        return tp_rank * (num_kv_heads // tp_size)
    return tp_rank // (tp_size // num_kv_heads)


def vocab_per_rank(vocab_size: int, tp_size: int) -> int:
    """Vocabulary rows each rank holds (the last rank's tail is padding)."""
    return -(-vocab_size // tp_size)


class VocabParallelEmbedding(nn.Embedding):
    """An embedding whose rows are split across the TP group (parameter ``weight``: this
    rank's ``vocab_per_rank`` rows).

    Args:
        vocab_size: The model's vocabulary.
        hidden_size: Embedding width.
        group: The TP group.
        dtype: Parameter dtype.
    """

    def __init__(self, vocab_size: int, hidden_size: int, group: GroupCoordinator,
                 dtype: torch.dtype | None = None) -> None:
        per_rank = vocab_per_rank(vocab_size, group.world_size)
        super().__init__(per_rank, hidden_size, dtype=dtype)
        self.group = group
        self.vocab_size = vocab_size
        self.vocab_start = group.rank_in_group * per_rank

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = super().forward(local.masked_fill(outside, 0))
        out.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.group.all_reduce(out)


def pp_layer_range(num_layers: int, pp_size: int, pp_rank: int) -> tuple[int, int]:
    """The decoder layers ``[start, end)`` pipeline stage ``pp_rank`` of ``pp_size`` runs:
    an even split, the first ``num_layers % pp_size`` stages taking one more.

    Raises:
        ValueError: Fewer layers than stages.
    """
    if num_layers < pp_size:
        raise ValueError(f"{num_layers} layers do not split into {pp_size} pipeline stages")
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return start, start + base + (1 if pp_rank < extra else 0)


class PPMissingLayer(nn.Module):
    """Stands where a module of another pipeline stage would be: holds no parameter, and
    keeps the indices (``model.layers.<i>``) of the stage's own layers the checkpoint's."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("this module runs on another pipeline stage")
