"""The ``ReasoningParser`` interface (public tier): splits reasoning from the answer.

The API is vLLM's: a parser written for vLLM ports by renaming ``vllm`` to ``forkless``
in its imports. Parsers written against the names vLLM used before late 2025
(``extract_reasoning_content`` / ``extract_reasoning_content_streaming``) keep working
for one deprecation cycle: defining or calling the old names warns once and names the new
ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from forkless.plugins import DEPRECATIONS, Deprecation, DeprecationKind, Stability, stability

if TYPE_CHECKING:
    from forkless.protocol.openai import ChatCompletionRequest, DeltaMessage

DEPRECATED_IN = "0.1.0"
REMOVED_IN = "0.2.0"

# Old method name -> the name it was renamed to (vLLM renamed them in late 2025).
RENAMED_METHODS = {
    "extract_reasoning_content": "extract_reasoning",
    "extract_reasoning_content_streaming": "extract_reasoning_streaming",
}


def _deprecation_name(old: str) -> str:
    return f"ReasoningParser.{old}"


for _old, _new in RENAMED_METHODS.items():
    DEPRECATIONS.add(Deprecation(DeprecationKind.PYTHON_API, _deprecation_name(_old), f"ReasoningParser.{_new}",
                                 DEPRECATED_IN, REMOVED_IN))


def _forward_to_old(old: str) -> Callable[..., Any]:
    """The new-name method of a subclass that implements only the old name."""

    def method(self: "ReasoningParser", *args: Any, **kwargs: Any) -> Any:
        return getattr(self, old)(*args, **kwargs)

    method.__name__ = RENAMED_METHODS[old]
    method._forwards_to_old_name = True  # type: ignore[attr-defined]
    return method


def _new_implementation(parser: "ReasoningParser", new: str) -> Callable[..., Any]:
    """The nearest real implementation of ``new`` (not a forwarder to the old name), so
    that ``super().extract_reasoning_content(...)`` in a parser written against the old
    names reaches its parent's implementation instead of coming back to itself."""
    for klass in type(parser).__mro__:
        impl = klass.__dict__.get(new)
        if impl is not None and not getattr(impl, "_forwards_to_old_name", False):
            if getattr(impl, "__isabstractmethod__", False):
                break
            return impl.__get__(parser, type(parser))
    raise NotImplementedError(f"{type(parser).__name__} implements neither {new} nor the deprecated name")


@stability(Stability.PUBLIC)
class ReasoningParser(ABC):
    """Separates a model's reasoning from its answer, whole or streamed.

    The API server creates one instance per chat request (so an implementation may keep
    per-request state between streaming calls), as ``cls(tokenizer, model_config=...,
    chat_template_kwargs=request.chat_template_kwargs or {})``, like vLLM (the base keeps
    ``model_config``, forkless's ``ModelConfig``, as ``self._model_config``; ``None`` where
    the engine core builds one). Subclasses should accept and pass on ``*args, **kwargs``.
    Before the request is rendered and sampled, :meth:`adjust_request` may change it.

    Must implement :meth:`extract_reasoning` and :meth:`extract_reasoning_streaming`.
    :meth:`is_reasoning_end` and :meth:`extract_content_ids` (token-id views used by
    vLLM's structured outputs, and by the server to see whether the prompt already closed
    the reasoning) are optional here.

    :attr:`reasoning_start_str` and :attr:`reasoning_end_str` (vLLM's) name the markers
    that ``thinking_token_budget`` counts from and forces; without them a budget needs
    ``--reasoning-config``.

    With structured outputs, the engine core builds one instance (``cls(tokenizer)``) to
    see where a constrained request's reasoning ends: :meth:`is_reasoning_end` of the
    prompt, then :attr:`end_token_id` among the sampled tokens. The grammar holds from the
    token after that one; a parser without an :attr:`end_token_id` cannot say, and
    constraints then hold from the first token (its reasoning is not split off them).

    Args:
        tokenizer: The served model's tokenizer.
    """

    #: The token that ends the reasoning, where that is one token of the vocabulary
    #: (``None``: it is not, or the parser does not say). A subclass sets it (an
    #: attribute or a property), as vLLM's ``BaseThinkingReasoningParser`` does.
    end_token_id: int | None = None

    @property
    def reasoning_start_str(self) -> str | None:
        """The text that starts the reasoning (``"<think>"``), or ``None`` when the parser
        does not say. vLLM's: the default start marker of ``thinking_token_budget``
        (``--reasoning-config``)."""
        return None

    @property
    def reasoning_end_str(self) -> str | None:
        """The text that ends the reasoning (``"</think>"``), or ``None``: what a request's
        spent ``thinking_token_budget`` forces, unless ``--reasoning-config`` says otherwise."""
        return None

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        self.model_tokenizer = tokenizer
        # get, not pop: a parser that wraps others passes the same kwargs on (as vLLM's).
        self._model_config: Any = kwargs.get("model_config")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A parser written against the old names: wire the new names to its methods. The
        # more derived definition wins, so overriding an old name of a parser that
        # implements the new one still takes effect.
        own = [k for k in cls.__mro__ if k is not ReasoningParser and issubclass(k, ReasoningParser)]

        def depth(name: str) -> int:
            return next((i for i, k in enumerate(own) if name in k.__dict__), len(own))

        for old, new in RENAMED_METHODS.items():
            if old in cls.__dict__ and depth(old) < depth(new):
                DEPRECATIONS.use(DeprecationKind.PYTHON_API, _deprecation_name(old))
                setattr(cls, new, _forward_to_old(old))

    @cached_property
    def vocab(self) -> dict[str, int]:
        """The tokenizer's vocabulary (token -> id)."""
        return self.model_tokenizer.get_vocab()

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether the reasoning has ended within ``input_ids``.

        The server asks it of the prompt: when the chat template already closed the
        reasoning (a thinking-disabled template writes ``<think></think>``), the whole
        output is content.

        Raises:
            NotImplementedError: This parser does not say (the server then assumes not).
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement is_reasoning_end")

    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Iterable[int]) -> bool:
        """:meth:`is_reasoning_end` for a decode step; ``delta_ids`` are its new tokens."""
        return self.is_reasoning_end(input_ids)

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        """The token ids of the content (what follows the reasoning) in ``input_ids``.

        Raises:
            NotImplementedError: This parser does not say.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement extract_content_ids")

    def adjust_request(self, request: "ChatCompletionRequest") -> "ChatCompletionRequest":
        """Change a chat request before it is sampled (its stop strings, say); the server
        calls it for every chat request while this parser is configured, before the tool
        parser's.

        Args:
            request: The chat request; it may be modified in place.

        Returns:
            The request to use.
        """
        return request

    def adjust_initial_state_from_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        """Called once per request, before any output, when the prompt leaves the reasoning
        open (:meth:`is_reasoning_end` of the prompt is false or not implemented): a parser
        whose state depends on how the chat template ended the prompt sets it here."""

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """How many of ``token_ids`` are reasoning; 0 when the parser cannot tell."""
        return 0

    @abstractmethod
    def extract_reasoning(self, model_output: str,
                          request: "ChatCompletionRequest") -> tuple[str | None, str | None]:
        """Split a finished output.

        Returns:
            ``(reasoning, content)``; ``None`` where there is none.
        """

    @abstractmethod
    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> "DeltaMessage | None":
        """Turn one streamed step into a delta.

        ``current_text == previous_text + delta_text``. The server relies on the
        ``reasoning`` and the ``content`` of all returned deltas adding up to what
        :meth:`extract_reasoning` returns for the final text (it tops up what is missing
        when the output ends).

        Returns:
            A ``DeltaMessage`` with ``reasoning`` and/or ``content``, or ``None`` when
            there is nothing to send yet.
        """

    def prepare_structured_tag(self, original_tag: str | None, tool_server: Any = None, *args: Any,
                               **kwargs: Any) -> str | None:
        """vLLM's hook for a structural tag that shapes the reasoning (gpt-oss's channels):
        the default returns ``original_tag``. forkless does not call it (its structured
        outputs constrain the answer, not the reasoning)."""
        return original_tag

    # The names vLLM used before late 2025 -------------------------------------------
    def extract_reasoning_content(self, model_output: str,
                                  request: "ChatCompletionRequest") -> tuple[str | None, str | None]:
        """Deprecated: call :meth:`extract_reasoning`."""
        DEPRECATIONS.use(DeprecationKind.PYTHON_API, _deprecation_name("extract_reasoning_content"))
        return _new_implementation(self, "extract_reasoning")(model_output, request)

    def extract_reasoning_content_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> "DeltaMessage | None":
        """Deprecated: call :meth:`extract_reasoning_streaming`."""
        DEPRECATIONS.use(DeprecationKind.PYTHON_API, _deprecation_name("extract_reasoning_content_streaming"))
        return _new_implementation(self, "extract_reasoning_streaming")(
            previous_text, current_text, delta_text, previous_token_ids, current_token_ids, delta_token_ids)
