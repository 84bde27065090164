"""Rotary embeddings, the ``rotary_embedding`` custom op (:mod:`forkless.ops.rotary`), under their old path."""

from forkless.ops.rotary import RotaryEmbedding

__all__ = ["RotaryEmbedding"]
