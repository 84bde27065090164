"""vLLM's exception classes (``vllm.exceptions``), for plugins ported from vLLM.

A logits processor's ``validate_params`` raises ``VLLMValidationError`` in vLLM; ported by
renaming ``vllm`` to ``forkless``, it imports it from here. forkless itself reports a bad
request as a ``ValueError`` naming the field, so the client errors here are ``ValueError``
subclasses: wherever forkless turns a ``ValueError`` into a 400 (or an offline caller
catches one), these behave the same.

Invariants:
    * Imports nothing: any process may import it, the API server without torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VLLMClientError", "VLLMError", "VLLMServerError", "VLLMValidationError"]


class VLLMError(Exception):
    """The base of the errors below (vLLM's)."""


class VLLMClientError(VLLMError, ValueError):
    """An error of the request (a 4xx); a ``ValueError``, as forkless's own request errors."""


class VLLMServerError(VLLMError):
    """An error of the server (a 5xx)."""


class VLLMValidationError(VLLMClientError):
    """A request argument that failed validation.

    Args:
        message: What is wrong, and what was expected.
        parameter: The argument's name, if known (appended to the message).
        value: The value refused, if known (appended to the message).
    """

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value

    def __str__(self) -> str:
        said = [f"{name}={v}" for name, v in (("parameter", self.parameter), ("value", self.value)) if v is not None]
        text = super().__str__()
        return f"{text} ({', '.join(said)})" if said else text
