"""Custom ops: layer operations a platform can reimplement (provisional extension point).

``from forkless.ops import CustomOp``. The built-in ops are ``rms_norm``
(:class:`~forkless.ops.layernorm.RMSNorm`, with and without the residual add),
``rotary_embedding`` (:class:`~forkless.ops.rotary.RotaryEmbedding`) and ``silu_and_mul``
(:class:`~forkless.ops.activation.SiluAndMul`); each picks ``forward_native`` /
``forward_cpu`` / ``forward_cuda`` / ``forward_oot`` once, when it is built.

Importing this package does not import torch: :func:`register_oot` (by class path) is
what a platform's ``pre_register_and_update`` calls in every process, the API server
included; :class:`CustomOp` itself is imported on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forkless.ops.registry import oot_ops, op_class, op_names, register_oot, unregister_oot

if TYPE_CHECKING:
    from forkless.ops.interface import CustomOp


def __getattr__(name: str) -> Any:
    if name == "CustomOp":
        from forkless.ops.interface import CustomOp

        return CustomOp
    raise AttributeError(f"module 'forkless.ops' has no attribute {name!r}")


__all__ = ["CustomOp", "oot_ops", "op_class", "op_names", "register_oot", "unregister_oot"]
