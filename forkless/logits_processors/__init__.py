"""Logits processors: batch-level logits transformations run in the workers.

``LogitsProcessor`` and ``BatchUpdate`` import without torch; the built-ins and
``build_logits_processors`` are imported on first access.
"""

from typing import TYPE_CHECKING, Any

from forkless.logits_processors.adapter import AdapterLogitsProcessor, RequestLogitsProcessor
from forkless.logits_processors.interface import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    MovedRequest,
    MoveDirectionality,
    RemovedRequest,
)
from forkless.logits_processors.registry import (
    BUILTIN_LOGITS_PROCESSORS,
    LOGITS_PROCESSORS_GROUP,
    build_logits_processors,
    load_custom_classes,
    validate_request_params,
)
from forkless.logits_processors.state import process_dict_updates

#: vLLM's name of the entry-point group constant (``LOGITSPROCS_GROUP``), renamed.
LOGITSPROCS_GROUP = LOGITS_PROCESSORS_GROUP

if TYPE_CHECKING:
    from forkless.logits_processors.allowed_token_ids import AllowedTokenIdsLogitsProcessor
    from forkless.logits_processors.bad_words import BadWordsLogitsProcessor
    from forkless.logits_processors.logit_bias import LogitBiasLogitsProcessor
    from forkless.logits_processors.min_p import MinPLogitsProcessor
    from forkless.logits_processors.min_tokens import MinTokensLogitsProcessor
    from forkless.logits_processors.thinking_budget import ThinkingTokenBudgetLogitsProcessor

_LAZY = {
    "MinTokensLogitsProcessor": "forkless.logits_processors.min_tokens",
    "LogitBiasLogitsProcessor": "forkless.logits_processors.logit_bias",
    "MinPLogitsProcessor": "forkless.logits_processors.min_p",
    "AllowedTokenIdsLogitsProcessor": "forkless.logits_processors.allowed_token_ids",
    "BadWordsLogitsProcessor": "forkless.logits_processors.bad_words",
    "ThinkingTokenBudgetLogitsProcessor": "forkless.logits_processors.thinking_budget",
}

__all__ = [
    "AdapterLogitsProcessor",
    "AddedRequest",
    "AllowedTokenIdsLogitsProcessor",
    "BUILTIN_LOGITS_PROCESSORS",
    "BadWordsLogitsProcessor",
    "BatchUpdate",
    "LOGITSPROCS_GROUP",
    "LOGITS_PROCESSORS_GROUP",
    "LogitBiasLogitsProcessor",
    "LogitsProcessor",
    "MinPLogitsProcessor",
    "MinTokensLogitsProcessor",
    "MoveDirectionality",
    "MovedRequest",
    "RemovedRequest",
    "RequestLogitsProcessor",
    "ThinkingTokenBudgetLogitsProcessor",
    "build_logits_processors",
    "load_custom_classes",
    "process_dict_updates",
    "validate_request_params",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'forkless.logits_processors' has no attribute {name!r}")
