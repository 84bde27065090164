"""The built-in processors vLLM keeps in ``vllm.v1.sample.logits_processor.builtin``, and
its ``process_dict_updates``, under that path renamed.

``process_dict_updates`` imports at once; the processor classes (which import torch) on
first access, as from the package.
"""

from typing import TYPE_CHECKING, Any

from forkless.logits_processors.state import process_dict_updates

if TYPE_CHECKING:
    from forkless.logits_processors.logit_bias import LogitBiasLogitsProcessor
    from forkless.logits_processors.min_p import MinPLogitsProcessor
    from forkless.logits_processors.min_tokens import MinTokensLogitsProcessor
    from forkless.logits_processors.thinking_budget import ThinkingTokenBudgetLogitsProcessor

__all__ = ["LogitBiasLogitsProcessor", "MinPLogitsProcessor", "MinTokensLogitsProcessor",
           "ThinkingTokenBudgetLogitsProcessor", "process_dict_updates"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import forkless.logits_processors

        return getattr(forkless.logits_processors, name)
    raise AttributeError(f"module 'forkless.logits_processors.builtin' has no attribute {name!r}")
