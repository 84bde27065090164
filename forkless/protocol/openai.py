"""Request and response bodies of the OpenAI-compatible API (pydantic models).

Field names follow the OpenAI API, plus the extra sampling fields vLLM accepts
(``top_k``, ``min_p``, ``min_tokens``, ``priority``, ``ignore_eos``, ...).

Invariants of request bodies (:class:`RequestModel`):
    * Every string in them, dictionary keys and unknown fields included, is valid
      Unicode: JSON can carry a lone surrogate (``"\\ud800"``), which no tokenizer, chat
      template or UTF-8 encoder accepts, so it is refused here, naming where it is.
    * They nest at most :data:`MAX_NESTING` levels deep.
    * Every number is finite: Python's JSON reads ``NaN``, ``Infinity`` and ``1e999``,
      which no sampling field can mean.

Response bodies send every field, ``null`` included, except in a streamed tool call's
deltas, which leave out what they do not carry (see :class:`_WithoutNulls`).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer,
                      model_validator)
from pydantic_core import PydanticCustomError


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIModel(BaseModel):
    # Unknown fields are kept (``model_extra``), not failed by pydantic: the server refuses
    # a request's unknown fields itself, naming each with a hint, after the fields it
    # refuses with a reason of their own (``serving.refuse_unknown_fields``).
    model_config = ConfigDict(extra="allow")


_SURROGATE = re.compile("[\ud800-\udfff]")

# Deeper JSON than any real request has (tool schemas included). Nested values such as
# extra_args are deep-copied and serialized recursively further on; bounding the depth
# here keeps those from exhausting the stack.
MAX_NESTING = 64


def find_invalid_json(data: Any) -> tuple[str, str] | None:
    """The first place in decoded JSON that a request may not hold: a string that is not
    valid Unicode (it has a lone surrogate), or nesting deeper than :data:`MAX_NESTING`.

    Iterative, so that any input is checked without exhausting the stack.

    Returns:
        ``(dotted path, what is wrong there)``, or ``None`` when all is well.
    """
    stack: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        where = ".".join(map(str, path)) or "body"
        if isinstance(value, str):
            bad = None if value.isascii() else _SURROGATE.search(value)
            if bad is not None:
                return where, f"not valid Unicode text (it contains a lone surrogate, U+{ord(bad.group()):04X})"
            continue
        if len(path) >= MAX_NESTING:
            return where, f"nested deeper than {MAX_NESTING} levels"
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and not key.isascii() and _SURROGATE.search(key):
                    return where, "a key is not valid Unicode text (it contains a lone surrogate)"
                if isinstance(item, (str, dict, list)):
                    stack.append(((*path, key), item))
        elif isinstance(value, list):
            stack.extend(((*path, i), item) for i, item in enumerate(value) if isinstance(item, (str, dict, list)))
    return None


class RequestModel(OpenAIModel):
    """A request body: valid Unicode text, bounded nesting and finite numbers only (see
    the module); its own fields' values of their JSON types, as OpenAI's API checks them
    (strict: ``"4"`` or ``true`` is not a ``max_tokens``, ``"yes"`` not a ``stream``; an
    integer is a number)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _valid_json(cls, data: Any) -> Any:
        invalid = find_invalid_json(data)
        if invalid is not None:
            # A model-level error has no location, so the path travels in ctx["param"].
            raise PydanticCustomError("invalid_json", "{what}", {"param": invalid[0], "what": invalid[1]})
        return data


class ErrorInfo(OpenAIModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(OpenAIModel):
    error: ErrorInfo


class StreamOptions(OpenAIModel):
    # Every option is implemented: an unknown one is a 400, not ignored.
    model_config = ConfigDict(extra="forbid")

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False
    # OpenAI's: false (or none) asks for what this server does, streams never obfuscated.
    include_obfuscation: bool | None = None

    @field_validator("include_obfuscation")
    @classmethod
    def _no_obfuscation(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("include_obfuscation=true is not supported: this server does not obfuscate streams")
        return value


class JsonSchemaFormat(OpenAIModel):
    """``response_format.json_schema``: OpenAI's structured-outputs schema (``name``
    required, as OpenAI and vLLM require it; an unknown key is a 400)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIModel):
    """OpenAI's ``response_format``: ``text``, ``json_object`` (any JSON object) or
    ``json_schema`` (a JSON value valid against ``json_schema.schema``). An unknown key, or
    a ``json_schema`` beside another type (which would not constrain anything), is a 400."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_only_with_its_type(self) -> "ResponseFormat":
        if self.json_schema is not None and self.type != "json_schema":
            raise ValueError(f'json_schema is given with type "{self.type}": send type "json_schema" to '
                             "constrain the answer to it, or leave json_schema out")
        return self


class SamplingFields(RequestModel):
    """Sampling fields shared by completions and chat completions."""

    model: str | None = None
    n: int = Field(1, le=128)  # OpenAI's own limit; without one, a huge n is a denial of service
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    # OpenAI's range: -100 bans a token, 100 all but forces it; more means nothing more.
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    user: str | None = None
    # OpenAI's, accepted without effect as user is: safety_identifier names the end user
    # for OpenAI's abuse checks, and prompt_cache_key steers requests to OpenAI's prompt
    # caches, where the prefix cache here serves every request alike.
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # vLLM extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # Keep this many prompt tokens (-1: as many as the context leaves room for); which
    # end is cut follows truncation_side, "left" (keep the last tokens) by default.
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    priority: int = 0
    request_id: str | None = None
    extra_args: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    # vLLM's: passed to the KV connector (Request.kv_transfer_params); needs one.
    kv_transfer_params: dict[str, Any] | None = None
    # vLLM's: mixed into the prefix-cache hashes, so the request shares cached blocks
    # only with requests of the same salt (one secret salt per tenant).
    cache_salt: str | None = None
    # Constrained decoding: OpenAI's response_format, and vLLM's structured_outputs
    # ({json|regex|choice|grammar|json_object, ...}: StructuredOutputsParams' fields).
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    # vLLM's beam search: the n best of n beams (scores divide by length ** length_penalty).
    use_beam_search: bool = False
    length_penalty: float = 1.0
    # vLLM's, accepted without effect as on vLLM's generation endpoints: session_id names
    # the requests of one conversation (vLLM routes a session to one of its engines; there
    # is one here), and the two others are read by vLLM's /render endpoints only.
    session_id: str | None = None
    return_token_offsets: bool | None = False
    return_mm_kwargs: bool = True
    # vLLM's: the most reasoning tokens; then the engine forces the end of the reasoning
    # (needs --reasoning-parser or --reasoning-config). -1: no limit.
    thinking_token_budget: int | None = None

    @field_validator("thinking_token_budget", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> Any:
        # vLLM's validator: an integer (not a bool, a float or a numeric string).
        if value is None or value == -1 and isinstance(value, int) and not isinstance(value, bool):
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError("`thinking_token_budget` must be a non-negative integer or -1 for unlimited.")
        return value

    # vLLM's: the response carries the prompt's and each choice's token ids (in a stream,
    # the prompt's in the first chunk of each choice, the new ids in every chunk).
    return_token_ids: bool | None = None
    # vLLM's: logprobs' tokens as "token_id:N" (None: the server's --return-tokens-as-token-ids).
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: a stream sends a chunk once this many tokens are new (the first and last at
    # once); never fewer than the server's --stream-interval. No effect without stream.
    stream_interval: int | None = Field(None, ge=1)

    @field_validator("n", "stream", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: Any) -> Any:
        # The OpenAI API declares both nullable (null: the default), and some clients send it.
        if value is None:
            return cls.model_fields[info.field_name].default
        return value

    @field_validator("cache_salt")
    @classmethod
    def _non_empty_cache_salt(cls, salt: str | None) -> str | None:
        if salt is not None and not salt:
            raise ValueError("cache_salt must be a non-empty string if given")
        return salt


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    # OpenAI's and vLLM's default for completions (chat's is what the context leaves);
    # an explicit null is that default too, as vLLM normalizes it.
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _null_max_tokens_is_16(cls, value: Any) -> Any:
        return 16 if value is None else value

    @field_validator("echo", mode="before")
    @classmethod
    def _null_echo_is_false(cls, value: Any) -> Any:
        # Nullable in the OpenAI API and in vLLM (false); some clients send null.
        return False if value is None else value


class ChatMessage(OpenAIModel):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # An earlier assistant turn's reasoning, as clients send it back: ``reasoning`` (vLLM's
    # name now) or ``reasoning_content`` (its old name, which chat templates such as
    # Qwen3's read). Either one fills both, so every template sees it.
    reasoning: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _both_reasoning_names(self) -> "ChatMessage":
        if self.reasoning is None:
            self.reasoning = self.reasoning_content
        elif self.reasoning_content is None:
            self.reasoning_content = self.reasoning
        return self


class FunctionDefinition(OpenAIModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatCompletionToolParam(OpenAIModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


ChatCompletionToolsParam = ChatCompletionToolParam
"""vLLM's name for :class:`ChatCompletionToolParam` (what vLLM-derived parsers import)."""


class _Closed(OpenAIModel):
    """A nested object whose unknown keys are refused (the request-level check sees only
    the top level); for objects that reach nothing that could read an extra key (a tool
    definition, which a chat template renders whole, is not one)."""

    @model_validator(mode="after")
    def _no_unknown_keys(self) -> "_Closed":
        if self.model_extra:
            raise ValueError(f"unrecognized field(s) {', '.join(map(repr, self.model_extra))}: expected only "
                             f"{', '.join(map(repr, type(self).model_fields))}")
        return self


class NamedFunction(_Closed):
    name: str


class NamedToolChoice(_Closed):
    type: Literal["function"] = "function"
    function: NamedFunction


ChatCompletionNamedFunction = NamedFunction
ChatCompletionNamedToolChoiceParam = NamedToolChoice
"""vLLM's names for :class:`NamedFunction` and :class:`NamedToolChoice`."""


class ResponsesRequest(RequestModel):
    """OpenAI's Responses API request (``POST /v1/responses``), the fields forkless serves.

    ``input`` is a string (one user message) or a list of items: messages (``role`` and
    ``content``, a string or ``input_text`` / ``output_text`` parts), ``function_call``
    and ``function_call_output`` items, and ``reasoning`` items. Tools are flat
    ``{"type": "function", "name", "description", "parameters"}`` objects.
    """

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)  # (OpenAI's range, include or not)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    include: list[str] | None = None
    background: bool | None = False
    service_tier: str | None = None
    # vLLM's extensions (its ResponsesRequest's), passed on to chat completions, which
    # checks them.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    request_id: str | None = None
    priority: int = 0
    cache_salt: str | None = None
    extra_args: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # vLLM's: a Jinja template (its text) for this request, refused unless the server was
    # started with --trust-request-chat-template.
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatCompletionToolParam] | None = None
    # None means the OpenAI default: "auto" when tools are given, else "none".
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    documents: list[dict[str, Any]] | None = None
    # vLLM's values; the chat template gets it (and enable_thinking, unless
    # chat_template_kwargs sets that: false for "none").
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    # vLLM's: the reply starts with the last message's content when that message has the
    # reply's role (a continued message, or an assistant prefill).
    echo: bool = False
    # vLLM's: false leaves the reasoning (and, with a reasoning parser, the per-token
    # logprobs and token ids, which would show it) out of the reply.
    include_reasoning: bool = True

    @field_validator("logprobs", mode="before")
    @classmethod
    def _null_logprobs_is_false(cls, value: Any) -> Any:
        # Nullable in the OpenAI API and in vLLM (false); some clients send null.
        return False if value is None else value


class PromptTokenUsageInfo(OpenAIModel):
    """vLLM's ``usage.prompt_tokens_details``: the prompt tokens found in the prefix cache."""

    cached_tokens: int | None = None


class CompletionTokenUsageInfo(OpenAIModel):
    """``usage.completion_tokens_details``: the generated tokens that were reasoning."""

    reasoning_tokens: int | None = None


class UsageInfo(OpenAIModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # Only where it was asked for, else left out of the JSON altogether: completions and
    # chat report it with --enable-prompt-tokens-details (as vLLM, only when some prompt
    # tokens were cached), and the Responses API's input_tokens_details are made from it.
    prompt_tokens_details: PromptTokenUsageInfo | None = Field(None, exclude_if=lambda value: value is None)
    # Chat reports it with a reasoning parser (as vLLM), and the Responses API's
    # output_tokens_details are made from it; left out of the JSON otherwise.
    completion_tokens_details: CompletionTokenUsageInfo | None = Field(None, exclude_if=lambda value: value is None)


class CompletionLogProbs(OpenAIModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(OpenAIModel):
    """One candidate token at one prompt position, as vLLM's ``Logprob`` serializes."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per prompt position: token id -> its logprob (the prompt token plus the top-k); the first
# position has none. A vLLM field outside the OpenAI API.
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionChoice(OpenAIModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None
    # vLLM's, with return_token_ids (streamed: the prompt's in the choice's first chunk).
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionStreamResponse(OpenAIModel):
    """One chunk of a streamed completion (OpenAI's, with the object of a whole one)."""

    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class CompletionResponse(CompletionStreamResponse):
    """A whole completion."""

    # vLLM's: the KV connector's hand-over for the engine that continues the request.
    kv_transfer_params: dict[str, Any] | None = None


class TopLogprob(OpenAIModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(OpenAIModel):
    content: list[ChatTokenLogprob] | None = None


class FunctionCall(OpenAIModel):
    # A parser may keep a model's own call id here (as vLLM's does); never serialized,
    # since OpenAI's function object has only name and arguments.
    id: str | None = Field(default=None, exclude=True)
    name: str
    arguments: str


class ToolCall(OpenAIModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl-tool"))
    type: Literal["function"] = "function"
    function: FunctionCall


class _WithoutNulls(OpenAIModel):
    """Serialized without its ``None`` fields.

    A streamed tool call's later deltas carry only ``index`` and the next piece of
    ``function.arguments``, as OpenAI and vLLM send them: the ``openai`` client's stream
    accumulator replaces ``type`` with each delta's, so a ``"type": null`` erases the
    call's type (and ``client.chat.completions.stream()`` fails on it).
    """

    @model_serializer(mode="wrap")
    def _without_nulls(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class DeltaFunctionCall(_WithoutNulls):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_WithoutNulls):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class ExtractedToolCallInformation(OpenAIModel):
    """What a tool parser found in a whole model output.

    Attributes:
        tools_called: Whether the output holds at least one tool call.
        tool_calls: The calls, in order.
        content: The text outside the calls (``None`` when there is none).
    """

    tools_called: bool
    tool_calls: list[ToolCall] = Field(default_factory=list)
    content: str | None = None


def _deprecated_reasoning_content(cls: type) -> None:
    """Record a use of ``reasoning_content`` in Python code (warns once, names the fix)."""
    from forkless.plugins import DEPRECATIONS, Deprecation, DeprecationKind

    name = f"{cls.__name__}.reasoning_content"
    if DEPRECATIONS.get(DeprecationKind.PYTHON_API, name) is None:
        DEPRECATIONS.add(Deprecation(DeprecationKind.PYTHON_API, name, f"{cls.__name__}.reasoning",
                                     REASONING_CONTENT_DEPRECATED_IN, REASONING_CONTENT_REMOVED_IN))
    DEPRECATIONS.use(DeprecationKind.PYTHON_API, name)


REASONING_CONTENT_DEPRECATED_IN = "0.1.0"
REASONING_CONTENT_REMOVED_IN = "0.2.0"


class _WithReasoning(OpenAIModel):
    """``reasoning`` (vLLM's field now) with ``reasoning_content`` as its deprecated alias.

    In Python, ``reasoning_content`` (as a constructor argument, attribute or assignment)
    reads and writes ``reasoning`` and warns once. On the wire both fields are sent, the old
    one a copy of the new, as vLLM did while clients moved over. Subclasses declare
    ``reasoning: str | None = None`` where it belongs in their field order.
    """

    @model_validator(mode="before")
    @classmethod
    def _old_reasoning_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "reasoning_content" in data:
            data = dict(data)
            old = data.pop("reasoning_content")
            if old is not None:
                _deprecated_reasoning_content(cls)
                if data.get("reasoning") is None:
                    data["reasoning"] = old
        return data

    @property
    def reasoning_content(self) -> str | None:
        """Deprecated: read ``reasoning``."""
        _deprecated_reasoning_content(type(self))
        return self.reasoning

    @reasoning_content.setter
    def reasoning_content(self, value: str | None) -> None:
        _deprecated_reasoning_content(type(self))
        self.reasoning = value

    @model_serializer(mode="wrap")
    def _with_old_reasoning_name(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and "reasoning" in data:
            # Same place in the object as before, right after "reasoning".
            out: dict[str, Any] = {}
            for key, value in data.items():
                out[key] = value
                if key == "reasoning":
                    out["reasoning_content"] = value
            return out
        return data


class ChatResponseMessage(_WithReasoning):
    role: str = "assistant"
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(OpenAIModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # vLLM's, with return_token_ids


class ChatCompletionResponse(OpenAIModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's, with return_token_ids
    kv_transfer_params: dict[str, Any] | None = None  # as CompletionResponse's


class DeltaMessage(_WithReasoning):
    """One streamed step of a chat message (what parsers return while streaming)."""

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(OpenAIModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # vLLM's, with return_token_ids: this chunk's


class ChatCompletionChunk(OpenAIModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    # vLLM's, with return_token_ids: in the first chunk of each choice (the role's).
    prompt_token_ids: list[int] | None = None


class ModelPermission(OpenAIModel):
    """What a client may do with a model (vLLM's card lists one; the OpenAI API once did):
    sample and read logprobs, nothing else."""

    id: str = Field(default_factory=lambda: f"modelperm-{uuid.uuid4().hex}")
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "forkless"
    root: str | None = None
    # A LoRA adapter's base model (the served model's name); None for the base model.
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(OpenAIModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadLoRAAdapterRequest(RequestModel):
    """``POST /v1/load_lora_adapter`` (with ``FORKLESS_ALLOW_RUNTIME_LORA_UPDATING=1``)."""

    lora_name: str
    lora_path: str
    # vLLM's: an adapter already served under this name is read again (from lora_path) and
    # replaces the one loaded, under the same id.
    load_inplace: bool = False


class AbortRequestsRequest(RequestModel):
    """``POST /abort_requests`` (with ``FORKLESS_SERVER_DEV_MODE=1``; vLLM's RL route)."""

    # The requests to end, each by its response id (``cmpl-...``) or the client's own id
    # (``X-Request-Id`` or the body's ``request_id``); none or empty: every request.
    request_ids: list[str] | None = None


class UnloadLoRAAdapterRequest(RequestModel):
    """``POST /v1/unload_lora_adapter`` (with ``FORKLESS_ALLOW_RUNTIME_LORA_UPDATING=1``)."""

    lora_name: str
    lora_int_id: int | None = None


class TokenizeRequest(RequestModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[ChatCompletionToolParam] | None = None
    chat_template: str | None = None  # as chat completions' (--trust-request-chat-template)
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False  # nullable, as in vLLM


class TokenizeResponse(OpenAIModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(OpenAIModel):
    prompt: str
