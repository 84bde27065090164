"""Pooling models: embeddings, classification and scores from a model's hidden states.

Invariants:
    * ``forkless.pooling.config`` is torch-free (the API server and the engine
      configuration read it); ``forkless.pooling.poolers`` and
      ``forkless.pooling.interface`` import torch and load only in workers.
    * A pooling request runs its whole prompt in one step and finishes there (see
      ``forkless.core.sched.scheduler``); what it returns is a ``PooledData``.
"""

from forkless.pooling.config import POOLING_TYPES, PoolerConfig

__all__ = ["POOLING_TYPES", "PoolerConfig"]
