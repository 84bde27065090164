"""SiLU-and-mul, the ``silu_and_mul`` custom op (:mod:`forkless.ops.activation`), under its old path."""

from forkless.ops.activation import SiluAndMul

__all__ = ["SiluAndMul"]
