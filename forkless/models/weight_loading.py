"""Copying Hugging Face-named checkpoint tensors into a model with fused projections."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable, Mapping, NamedTuple

import torch
from torch import nn

from forkless.logger import init_logger

logger = init_logger(__name__)


class TensorShard(NamedTuple):
    """The part of a checkpoint tensor one tensor-parallel rank reads.

    Attributes:
        dim: The dimension it is cut along.
        start: Its first index along ``dim``.
        size: How many indices it spans.
    """

    dim: int
    start: int
    size: int


class FusedShard(NamedTuple):
    """Where a checkpoint module's rows live inside a fused module of the model.

    Attributes:
        target: Name of the fused module (``qkv_proj``) replacing the checkpoint's
            (``q_proj``) in the parameter path.
        offset: First row (dim 0) of this shard in the fused parameter.
        size: Rows of the shard.
    """

    target: str
    offset: int
    size: int


def load_named_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    fused: Mapping[str, FusedShard],
    skip_suffixes: tuple[str, ...] = (),
    padded: tuple[str, ...] = (),
) -> set[str]:
    """Load ``(name, tensor)`` pairs into ``model``'s parameters.

    Args:
        model: The model; its ``named_parameters()`` names are the targets.
        weights: Checkpoint pairs with Hugging Face names.
        fused: Checkpoint module name (``"q_proj"``) -> its shard of a fused module.
        skip_suffixes: Checkpoint names ending with any of these are ignored.
        padded: Parameter names whose first dimension may be longer than the tensor's
            (a rank's share of a padded vocabulary): the tensor fills its first rows, the
            rest are zeroed.

    Returns:
        The model parameter names that were fully loaded.

    Raises:
        ValueError: A tensor's shape does not fit its parameter (the message names both),
            or some parameters received no weight (the message lists them).
    """
    params = dict(model.named_parameters())
    shards_per_target = Counter(shard.target for shard in fused.values())
    filled: dict[str, set[int]] = defaultdict(set)
    unexpected: list[str] = []

    with torch.no_grad():
        for name, tensor in weights:
            if name.endswith(skip_suffixes):
                continue
            parts = name.split(".")
            shard = fused.get(parts[-2]) if len(parts) >= 2 else None
            if shard is not None:
                parts[-2] = shard.target
            param_name = ".".join(parts)
            param = params.get(param_name)
            if param is None:
                unexpected.append(name)
                continue
            dest = param.data if shard is None else param.data.narrow(0, shard.offset, shard.size)
            if param_name in padded and tensor.dim() == dest.dim() and tensor.shape[0] < dest.shape[0]:
                dest.narrow(0, tensor.shape[0], dest.shape[0] - tensor.shape[0]).zero_()
                dest = dest.narrow(0, 0, tensor.shape[0])
            if dest.shape != tensor.shape:
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, but "
                    f"{param_name!r} expects {tuple(dest.shape)}"
                )
            dest.copy_(tensor)
            filled[param_name].add(0 if shard is None else shard.offset)

    if unexpected:
        logger.warning(
            "ignored %d checkpoint tensor(s) the model has no parameter for: %s",
            len(unexpected), ", ".join(unexpected[:10]) + (" ..." if len(unexpected) > 10 else ""),
        )
    loaded = set()
    for param_name in params:
        module_name = param_name.split(".")[-2] if "." in param_name else ""
        if len(filled.get(param_name, ())) >= shards_per_target.get(module_name, 1):
            loaded.add(param_name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(
            f"checkpoint is missing weights for {len(missing)} parameter(s): "
            + ", ".join(missing[:20])
            + (" ..." if len(missing) > 20 else "")
        )
    return loaded
