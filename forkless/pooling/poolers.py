"""Pooling a step's hidden states into one result per request (worker side, torch).

Invariants:
    * The step's hidden states are the flattened batch (``[T, H]``, no padding between
      sequences); request ``i`` owns rows ``starts[i]:starts[i + 1]``, its whole prompt.
    * Every result leaves as float32 (``PooledData``); the model's dtype stays inside.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from forkless.pooling_params import PooledData, PoolingParams

if TYPE_CHECKING:
    from forkless.pooling.config import PoolerConfig


def pool_rows(hidden: torch.Tensor, starts: np.ndarray, pooling_type: str) -> torch.Tensor | list[torch.Tensor]:
    """One row per request (``CLS``, ``LAST``, ``MEAN``) or its token rows (``ALL``).

    Args:
        hidden: ``[T, H]`` hidden states of the step.
        starts: ``[B + 1]`` cumulative token counts (host).
        pooling_type: ``CLS``, ``LAST``, ``MEAN`` or ``ALL``.

    Returns:
        ``[B, H]``, or for ``ALL`` a list of ``[len_i, H]``.
    """
    device = hidden.device
    if pooling_type == "CLS":
        return hidden[torch.from_numpy(starts[:-1].astype(np.int64)).to(device)]
    if pooling_type == "LAST":
        return hidden[torch.from_numpy(starts[1:].astype(np.int64) - 1).to(device)]
    if pooling_type == "MEAN":
        lens = np.diff(starts)
        rows = torch.from_numpy(np.repeat(np.arange(len(lens)), lens)).to(device)
        sums = torch.zeros((len(lens), hidden.shape[1]), dtype=torch.float32, device=device)
        sums.index_add_(0, rows, hidden.float())
        return sums / torch.from_numpy(lens.astype(np.float32)).to(device).unsqueeze(1)
    if pooling_type == "ALL":
        return [hidden[int(a):int(b)] for a, b in zip(starts[:-1], starts[1:])]
    raise ValueError(f"unknown pooling type {pooling_type!r}")


def _embedding(x: torch.Tensor, params: PoolingParams, cfg: PoolerConfig) -> torch.Tensor:
    x = x.float()
    dims = params.dimensions if params.dimensions is not None else cfg.dimensions
    if dims is not None:
        x = x[..., :dims]
    normalize = cfg.normalize if params.normalize is None else params.normalize
    return F.normalize(x, p=2, dim=-1) if normalize else x


def _activate(logits: torch.Tensor, params: PoolingParams, cfg: PoolerConfig) -> torch.Tensor:
    logits = logits.float()
    if cfg.logit_bias is not None:
        logits = logits - cfg.logit_bias
    use = cfg.use_activation if params.use_activation is None else params.use_activation
    if not use:
        return logits
    return torch.sigmoid(logits) if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)


def pool_step(model: Any, hidden: torch.Tensor, starts: np.ndarray, params: list[PoolingParams],
              cfg: PoolerConfig) -> list[PooledData]:
    """Every request's result, in batch order.

    Args:
        model: The model (its ``classify`` for classification tasks).
        hidden: ``[T, H]`` hidden states of the step.
        starts: ``[B + 1]`` cumulative token counts.
        params: Each request's pooling parameters (``task`` filled in).
        cfg: The engine's pooling.

    Returns:
        One :class:`PooledData` per request.
    """
    tasks = [p.task or cfg.task for p in params]
    per_token = any(t in ("token_embed", "token_classify", "encode") for t in tasks)
    pooled = pool_rows(hidden, starts, cfg.pooling_type)
    all_rows = pool_rows(hidden, starts, "ALL") if per_token and cfg.pooling_type != "ALL" else None
    classify_rows = [i for i, t in enumerate(tasks) if t in ("classify", "score") and cfg.num_labels]
    logits: dict[int, torch.Tensor] = {}
    if classify_rows:
        if isinstance(pooled, list):
            raise ValueError("classification needs one pooled row per request: pooling_type ALL cannot classify")
        index = torch.tensor(classify_rows, device=hidden.device)
        for i, row in zip(classify_rows, model.classify(pooled.index_select(0, index))):
            logits[i] = row
    results: list[torch.Tensor] = []
    for i, (task, p) in enumerate(zip(tasks, params)):
        if i in logits:
            results.append(_activate(logits[i], p, cfg))
        elif task == "token_classify":
            rows = all_rows[i] if all_rows is not None else pooled[i]
            results.append(_activate(model.classify(rows), p, cfg))
        elif task in ("token_embed", "encode"):
            rows = all_rows[i] if all_rows is not None else pooled[i]
            results.append(_embedding(rows, p, cfg))
        else:  # embed, or score by embedding similarity (cosine of normalised vectors)
            results.append(_embedding(pooled[i], p, cfg))
    if results and all(r.shape == results[0].shape for r in results):
        # One host copy for the step, not one per request (each would sync a device).
        host = list(torch.stack(results).to("cpu", torch.float32).numpy())
    else:
        host = [r.detach().to("cpu", torch.float32).numpy() for r in results]
    return [PooledData.from_numpy(a) for a in host]
