"""forkless: a small, fast, multi-process LLM inference server built of plugins.

The public names are imported lazily so that ``import forkless`` stays cheap in every
process (the plugin loader and the API server never need torch).
"""

from typing import TYPE_CHECKING, Any

from forkless import module_aliases
from forkless.version import __version__

module_aliases.install()

if TYPE_CHECKING:
    from forkless.config import AsyncEngineArgs, EngineArgs
    from forkless.engine.async_llm import AsyncLLM
    from forkless.engine.llm_engine import LLMEngine
    from forkless.entrypoints.llm import LLM
    from forkless.inputs import PromptType, TextPrompt, TokensPrompt
    from forkless.models.registry import ModelRegistry
    from forkless.outputs import (
        ClassificationOutput,
        ClassificationRequestOutput,
        CompletionOutput,
        EmbeddingOutput,
        EmbeddingRequestOutput,
        PoolingOutput,
        PoolingRequestOutput,
        RequestOutput,
        ScoringOutput,
        ScoringRequestOutput,
    )
    from forkless.pooling_params import PoolingParams
    from forkless.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

# vLLM's top-level names, where forkless has them.
_LAZY = {
    "LLM": "forkless.entrypoints.llm",
    "SamplingParams": "forkless.sampling_params",
    "StructuredOutputsParams": "forkless.sampling_params",
    "RequestOutputKind": "forkless.sampling_params",
    "PoolingParams": "forkless.pooling_params",
    "AsyncLLM": "forkless.engine.async_llm",
    "LLMEngine": "forkless.engine.llm_engine",
    "EngineArgs": "forkless.config",
    "AsyncEngineArgs": "forkless.config",
    "ModelRegistry": "forkless.models.registry",
    "PromptType": "forkless.inputs",
    "TextPrompt": "forkless.inputs",
    "TokensPrompt": "forkless.inputs",
    **{name: "forkless.outputs" for name in (
        "RequestOutput", "CompletionOutput", "PoolingOutput", "PoolingRequestOutput", "EmbeddingOutput",
        "EmbeddingRequestOutput", "ClassificationOutput", "ClassificationRequestOutput", "ScoringOutput",
        "ScoringRequestOutput")},
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'forkless' has no attribute {name!r}")
