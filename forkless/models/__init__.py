"""Model architectures and their registry.

``ModelRegistry`` (also ``forkless.ModelRegistry``, and vLLM's
``vllm.model_executor.models.ModelRegistry`` path renamed) is imported on first access:
the architectures' modules import torch, the registry does not.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forkless.models.registry import ModelRegistry

__all__ = ["ModelRegistry"]


def __getattr__(name: str) -> Any:
    if name == "ModelRegistry":
        from forkless.models.registry import ModelRegistry

        return ModelRegistry
    raise AttributeError(f"module 'forkless.models' has no attribute {name!r}")
