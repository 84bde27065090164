"""forkless: a small, fast, multi-process LLM inference server built of plugins.

The public names are imported lazily so that ``import forkless`` stays cheap in every
process (the plugin loader and the API server never need torch).
"""

from typing import TYPE_CHECKING, Any

from forkless import module_aliases
from forkless.version import __version__

module_aliases.install()

if TYPE_CHECKING:
    from forkless.engine.async_llm import AsyncLLM
    from forkless.entrypoints.llm import LLM
    from forkless.models.registry import ModelRegistry
    from forkless.sampling_params import SamplingParams, StructuredOutputsParams

_LAZY = {
    "LLM": "forkless.entrypoints.llm",
    "SamplingParams": "forkless.sampling_params",
    "StructuredOutputsParams": "forkless.sampling_params",
    "AsyncLLM": "forkless.engine.async_llm",
    "ModelRegistry": "forkless.models.registry",
}

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "AsyncLLM", "ModelRegistry", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'forkless' has no attribute {name!r}")
