"""RMSNorm, the ``rms_norm`` custom op (:mod:`forkless.ops.layernorm`), under its old path."""

from forkless.ops.layernorm import RMSNorm

__all__ = ["RMSNorm"]
