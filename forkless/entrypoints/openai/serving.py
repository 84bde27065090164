"""The OpenAI endpoints' logic: request -> ``SamplingParams`` -> engine -> response/SSE.

As vLLM's server, a stream asks the engine for ``DELTA`` outputs (what is new since the
previous output, per choice; outputs a slow stream missed arrive merged into one) and a
non-streaming request for ``FINAL_ONLY`` (one output when it finishes), so no step copies
what came before it: a request of n tokens costs O(n), not O(n^2). Each stream keeps per
choice what a chunk needs (tokens whose text is held back, text length for ``text_offset``,
token counts for usage; the whole text only for chat parsers, which read it).

Invariants:
    * Tokenizing, rendering chat templates and decoding whole prompts run in one
      tokenizer thread, never on the event loop: a multi-megabyte prompt takes seconds,
      during which the loop keeps serving health checks and streaming other responses.
      One thread, as in vLLM: Hugging Face tokenizers are not safe to call from several
      threads at once.
    * Text longer than ``max_text_chars`` (``max_model_len`` plus a margin, times the
      longest token's length: a token covers at most that many characters) must make
      more tokens than the context holds, so it is refused before it reaches the tokenizer
      thread, or, for completions with ``truncate_prompt_tokens``, cut to that many
      characters on the side truncation keeps. One request's text then costs that thread
      at most about a second, not ~2 s per MB (a 10 MB prompt held every other request
      behind it for 18 s).
    * A request asks for at most ``max_sequences_per_request`` sequences (prompts × n),
      checked before any prompt is tokenized.
    * ``text_offset`` in completions logprobs indexes into the choice's text as the client
      receives it (echoed prompt included, across streamed chunks).
    * Every request field is read or refused: a field no request model declares is a 400
      naming it (:func:`refuse_unknown_fields`), on every endpoint.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterable, Sequence, TypeVar

import msgspec

from forkless.engine.detokenizer import IncrementalDetokenizer
from forkless.engine.processor import NoChatTemplateError, message_text
from forkless.entrypoints.openai.chat_options import ChatOptions
from forkless.entrypoints.openai.chat_parsing import ChoiceParser, checked_return, make_choice_parser
from forkless.entrypoints.openai.errors import BadRequest, error_type, quoted
from forkless.entrypoints.openai.http_limits import DEFAULT_MAX_SEQUENCES_PER_REQUEST
from forkless.entrypoints.openai.serving_models import ServingModels
from forkless.protocol.openai import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
    ChatStreamChoice,
    ChatTokenLogprob,
    NamedToolChoice,
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
    DeltaMessage,
    DetokenizeRequest,
    DetokenizeResponse,
    PromptLogprob,
    PromptLogprobs,
    CompletionTokenUsageInfo,
    PromptTokenUsageInfo,
    RequestModel,
    SamplingFields,
    TokenizeRequest,
    TokenizeResponse,
    TopLogprob,
    UsageInfo,
    random_id,
)
from forkless.entrypoints.openai.structured import (ForcedToolCalls, forced_tool_choice, request_constraint,
                                                     tool_constraint)
from forkless.logger import init_logger
from forkless.lora import LoRARequest
from forkless.sampling_params import (BeamSearchParams, RequestOutputKind, SamplingParams, StructuredOutputsParams,
                                      check_logprobs_count)

if TYPE_CHECKING:
    from forkless.engine.async_llm import AsyncLLM
    from forkless.outputs import CompletionOutput, RequestOutput

logger = init_logger("forkless.entrypoints.openai")


T = TypeVar("T")

# vLLM request fields that forkless does not implement, with the values that ask for
# nothing (clients that send those explicitly keep working); any other value is a 400
# naming the field. Only fields the request model does not declare are checked, so
# declaring a field (implementing it) takes it off these lists.
_UNSUPPORTED_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    "watermarking": ((None, False), "watermarking is not supported"),
    "logprob_token_ids": ((None,), "logprob_token_ids is not supported; use logprobs"),
    "prompt_embeds": ((None,), "prompt embeddings are not supported"),
    "guided_json": ((None,), 'vLLM replaced it: use structured_outputs={"json": ...}'),
    "guided_regex": ((None,), 'vLLM replaced it: use structured_outputs={"regex": ...}'),
    "guided_choice": ((None,), 'vLLM replaced it: use structured_outputs={"choice": [...]}'),
    "guided_grammar": ((None,), 'vLLM replaced it: use structured_outputs={"grammar": ...}'),
    "ec_transfer_params": ((None,), "disaggregated serving (ec_transfer_params) is not supported"),
    "repetition_detection": ((None,), "repetition_detection is not supported"),
    "routed_experts_prompt_start": ((None, 0), "routed experts are not returned"),
    "mm_processor_kwargs": ((None, {}), "multimodal inputs are not supported"),
    "media_io_kwargs": ((None, {}), "multimodal inputs are not supported"),
    "early_stopping": ((None, False), "beam search runs every beam to max_tokens or EOS"),
    # vLLM SamplingParams fields that vLLM's server does not take either (it logs them as
    # ignored): each changes the answer, so a value other than its default is refused.
    "prompt_logprob_token_ids": ((None,), "prompt_logprob_token_ids is not supported; use prompt_logprobs"),
    "prompt_logprob_start": ((None, 0), "prompt logprobs always start at the first prompt token"),
    "trace_decode_token_ids": ((None,), "trace_decode_token_ids is not supported: tokens are sampled"),
    "detokenize": ((None, True), "detokenize=false is not supported: the answer is text"),
    # Also engine-level only in vLLM, but either value is honoured: it picks the container
    # that holds logprobs in the engine's memory (vLLM's FlatLogprobs), and the JSON answer
    # is the same whichever it is. Anything but a boolean is refused.
    "flat_logprobs": ((None, False, True), "flat_logprobs must be true or false"),
    # vLLM's per-request processors by qualified name (which vLLM refuses unless started
    # with --logits-processor-pattern): forkless runs batch-level processors only.
    "logits_processors": ((None, []), "per-request logits processors are not supported; start the server "
                                      "with --logits-processors and pass their arguments in vllm_xargs"),
}
_UNSUPPORTED_COMPLETION_FIELDS = {
    "add_special_tokens": ((None, True), "add_special_tokens=false is not supported: the prompt is "
                                         "tokenized with the tokenizer's special tokens"),
    "max_completion_tokens": ((None,), "max_completion_tokens is a chat completions field; "
                                       "/v1/completions takes max_tokens"),
}
_UNSUPPORTED_CHAT_FIELDS = {
    "add_special_tokens": ((None, False), "add_special_tokens=true is not supported: the chat template "
                                          "writes the special tokens"),
    "functions": ((None,), "the legacy functions field is not supported; use tools"),
    "function_call": ((None,), "the legacy function_call field is not supported; use tool_choice"),
    # vLLM's: the answer would carry the templated prompt as prompt_text.
    "return_prompt_text": ((None, False), "return_prompt_text is not supported"),
    "modalities": ((None, ["text"]), "only text output is supported"),
    "audio": ((None,), "audio output is not supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    # OpenAI's: they change the answer (its length, a web search), which the model here
    # cannot be told to do (as /v1/responses refuses text.verbosity and web_search tools).
    "verbosity": ((None,), "verbosity is not supported: the model answers as its chat template and "
                           "sampling make it"),
    "web_search_options": ((None,), "web search is not supported"),
}


def reject_field(name: str, value: Any, endpoint: dict[str, tuple[tuple[Any, ...], str]]) -> bool:
    """A 400 naming ``name`` when ``value`` is not one its table (``endpoint``'s, else
    :data:`_UNSUPPORTED_FIELDS`) accepts; a field in neither table passes.

    Returns:
        Whether a table knows the field (else it is one the caller may log as ignored).
    """
    known = endpoint.get(name) or _UNSUPPORTED_FIELDS.get(name)
    if known is not None and value not in known[0]:
        raise BadRequest(f"{name}={quoted(value)}: {known[1]}", name)
    return known is not None


def _reject_unsupported(req: SamplingFields) -> None:
    """Refuse vLLM request fields that this server would otherwise silently ignore."""
    options = req.stream_options
    if options is not None and not req.stream:
        raise BadRequest("stream_options can only be given with stream=true", "stream_options")
    extra = req.model_extra or {}
    if not extra:
        return
    endpoint = _UNSUPPORTED_COMPLETION_FIELDS if isinstance(req, CompletionRequest) else _UNSUPPORTED_CHAT_FIELDS
    for name, value in extra.items():
        if name == "best_of" and value not in (None, req.n):
            raise BadRequest(f"best_of={quoted(value)} is not supported (vLLM removed it too); use n", "best_of")
        reject_field(name, value, endpoint)


def _reject_unsupported_chat_tokenize(req: Any) -> None:
    """Refuse the fields of vLLM's chat ``/tokenize`` (and the pooling endpoints'
    ``messages``) that chat completions refuse too (``add_special_tokens: true``,
    multimodal kwargs), which the conversation's tokens would otherwise silently not
    follow."""
    if req.add_special_tokens and "add_special_tokens" in req.model_fields_set:
        # An explicit true: the default (true) is the one for a plain prompt.
        raise BadRequest(f"add_special_tokens=True with messages: {_UNSUPPORTED_CHAT_FIELDS['add_special_tokens'][1]}",
                         "add_special_tokens")
    extra = req.model_extra or {}
    for name in ("mm_processor_kwargs", "media_io_kwargs"):
        if name in extra:
            reject_field(name, extra[name], _UNSUPPORTED_CHAT_FIELDS)


def refuse_unknown_fields(names: Iterable[str], declared: Iterable[str]) -> None:
    """A 400 naming the first of ``names``: fields of a request that its model does not
    declare and no table of refused fields lists. As the OpenAI API answers an argument it
    does not know: a field that nothing reads is refused, never accepted and ignored (a
    misspelt ``max_token`` would otherwise run to the end of the context).

    Args:
        names: The unknown fields (a request's ``model_extra`` less what its tables know).
        declared: Every field the endpoint knows, for a "did you mean" hint.

    Raises:
        BadRequest: When ``names`` has any.
    """
    for name in names:
        close = difflib.get_close_matches(name, sorted(declared), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise BadRequest(f"Unrecognized request argument supplied: {quoted(name, 100)}{hint}; fields this server "
                         "does not implement are refused, not ignored", quoted(name, 100))


def check_unknown_fields(req: RequestModel) -> None:
    """:func:`refuse_unknown_fields` for a completions, chat or tokenizer request (the
    refused-field tables' names are checked by their own rules)."""
    known: dict[str, Any] = {}
    if isinstance(req, SamplingFields):
        endpoint = _UNSUPPORTED_COMPLETION_FIELDS if isinstance(req, CompletionRequest) else _UNSUPPORTED_CHAT_FIELDS
        known = {**_UNSUPPORTED_FIELDS, **endpoint, "best_of": None}
    extra = req.model_extra or {}
    refuse_unknown_fields((name for name in extra if name not in known), [*type(req).model_fields, *known])


def to_sampling_params(req: SamplingFields, max_tokens: int | None, logprobs: int | None,
                       default_max_tokens: int, structured: StructuredOutputsParams | None = None,
                       defaults: dict[str, Any] | None = None) -> SamplingParams:
    """Translate request fields into ``SamplingParams``; bad values raise ``BadRequest``.

    A stream asks for ``DELTA`` outputs, anything else for ``FINAL_ONLY`` (as vLLM's
    ``to_sampling_params``). ``structured`` is a forced tool choice's constraint, which
    ``response_format`` and ``structured_outputs`` may not add to. ``defaults`` (the
    model's generation-config defaults, ``ModelConfig.sampling_defaults``) fill the
    sampling fields the request leaves out; its ``max_tokens`` caps ``default_max_tokens``.
    """
    defaults = defaults or {}

    def default(name: str, value: Any, fallback: Any) -> Any:
        return value if value is not None else defaults.get(name, fallback)

    if max_tokens is None and defaults.get("max_tokens") is not None:
        default_max_tokens = min(default_max_tokens, defaults["max_tokens"])
    _reject_unsupported(req)
    if req.length_penalty != 1.0:
        raise BadRequest("length_penalty only applies with use_beam_search=true", "length_penalty")
    constraint = request_constraint(req)
    if structured is not None and constraint is not None:
        raise BadRequest('tool_choice "required" or a named function already constrains the output; leave '
                         "out response_format / structured_outputs", "tool_choice")
    extra = dict(req.vllm_xargs or {})
    extra.update(req.extra_args or {})
    if req.kv_transfer_params is not None:
        extra["kv_transfer_params"] = req.kv_transfer_params  # where vLLM puts it
    prompt_logprobs = req.prompt_logprobs
    if prompt_logprobs is not None:
        if req.stream and prompt_logprobs != 0:  # 0 asks for nothing to stream (vLLM's rule)
            raise BadRequest("prompt_logprobs are not available when stream=true", "prompt_logprobs")
    elif isinstance(req, CompletionRequest) and req.echo:
        # As vLLM: the echoed prompt's tokens get logprobs too (streaming included).
        prompt_logprobs = logprobs
    elif isinstance(req, ChatCompletionRequest) and req.echo and not req.stream:
        # As vLLM: a chat echo asks for the prompt's logprobs, top_logprobs of them (vLLM's
        # top_logprobs defaults to 0: the prompt tokens' own), which the reply's
        # prompt_logprobs carries. A stream has no place for them (vLLM computes and drops
        # them), so they are not asked for there.
        prompt_logprobs = logprobs or 0
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        # A token id in its one spelling ("5", not " 5", "+5", "05" or "5_0", which int()
        # takes: two keys of one token would be merged without a word).
        if not (key.isascii() and key.isdigit() and (key == "0" or key[0] != "0")):
            raise BadRequest(f"logit_bias key {key!r:.40} is invalid: expected a token id, an integer as a string "
                             "of decimal digits without leading zeros", "logit_bias")
        bias[int(key)] = float(value)
    kwargs: dict[str, Any] = dict(
        n=req.n,
        temperature=default("temperature", req.temperature, 1.0),
        top_p=default("top_p", req.top_p, 1.0),
        top_k=default("top_k", req.top_k, 0),
        min_p=default("min_p", req.min_p, 0.0),
        seed=req.seed,
        max_tokens=default_max_tokens if max_tokens is None else max_tokens,
        min_tokens=req.min_tokens,
        stop=[] if req.stop is None else req.stop,  # "" is refused as [""] is, not dropped
        stop_token_ids=req.stop_token_ids or [],
        ignore_eos=req.ignore_eos,
        logprobs=logprobs,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=default("repetition_penalty", req.repetition_penalty, 1.0),
        logit_bias=bias or None,
        skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        prompt_logprobs=prompt_logprobs,
        allowed_token_ids=req.allowed_token_ids,
        bad_words=req.bad_words or None,
        extra_args=extra or None,
        output_kind=RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY,
        structured_outputs=structured or constraint,
        thinking_token_budget=req.thinking_token_budget,
        stream_interval=req.stream_interval,  # (no effect on FINAL_ONLY: vLLM ignores it unstreamed)
    )
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as exc:
        # SamplingParams names the field first: "SamplingParams.top_p=2.0 is invalid: ...".
        raise BadRequest(str(exc), _refused_field(str(exc), req)) from None


# Sampling fields that beam search has no use for -> the values that ask for nothing. vLLM
# ignores them with use_beam_search; here a request that sets one is refused.
_NOT_WITH_BEAM_SEARCH: dict[str, tuple[Any, ...]] = {
    "top_p": (None, 1.0), "top_k": (None, 0, -1), "min_p": (None, 0.0), "seed": (None,),
    "presence_penalty": (None, 0.0), "frequency_penalty": (None, 0.0), "repetition_penalty": (None, 1.0),
    "logit_bias": (None, {}), "min_tokens": (0,), "stop": (None, []), "stop_token_ids": (None, []),
    "allowed_token_ids": (None,), "bad_words": (None, []), "prompt_logprobs": (None,),
    "structured_outputs": (None,), "echo": (None, False), "cache_salt": (None,),
    "spaces_between_special_tokens": (True,),
    # A logits processor's arguments: beam search runs no logits processors, so a plugin's
    # argument (and its validate_params) was silently skipped.
    "vllm_xargs": (None, {}), "extra_args": (None, {}),
    # Beam search runs no logits processors, the reasoning budget's neither.
    "thinking_token_budget": (None,),
}


def to_beam_search_params(req: SamplingFields, max_tokens: int | None, default_max_tokens: int,
                          logprobs: int | None, defaults: dict[str, Any] | None = None) -> BeamSearchParams:
    """The request's ``use_beam_search`` as ``BeamSearchParams``: ``n`` beams (vLLM's mapping).

    Raises:
        BadRequest: A field beam search cannot honour is set, or a value is invalid.
    """
    _reject_unsupported(req)
    for name, nothing in _NOT_WITH_BEAM_SEARCH.items():
        if name == "echo" and isinstance(req, ChatCompletionRequest):
            continue  # a chat echo only prepends the last message to each reply
        if getattr(req, name, None) not in nothing:
            raise BadRequest(f"{name} cannot be used with use_beam_search (beam search ranks beams by their "
                             "logprobs alone)", name)
    if req.response_format is not None and req.response_format.type != "text":
        raise BadRequest("response_format cannot be used with use_beam_search", "response_format")
    if logprobs is not None and logprobs > 2 * req.n:
        raise BadRequest(f"with use_beam_search each step has the {2 * req.n} most likely tokens (2 × n): "
                         f"ask for at most that many logprobs, not {logprobs}",
                         "logprobs" if isinstance(req, CompletionRequest) else "top_logprobs")
    temperature = req.temperature if req.temperature is not None else (defaults or {}).get("temperature", 1.0)
    try:
        return BeamSearchParams(beam_width=req.n, max_tokens=default_max_tokens if max_tokens is None else max_tokens,
                                ignore_eos=req.ignore_eos, temperature=temperature,
                                length_penalty=req.length_penalty,
                                include_stop_str_in_output=req.include_stop_str_in_output,
                                skip_special_tokens=req.skip_special_tokens)
    except ValueError as exc:
        raise BadRequest(str(exc), _refused_field(str(exc), req)) from None


async def _first_output(stream: AsyncIterator["RequestOutput"]) -> "RequestOutput | None":
    """The first output of ``stream``, or None when it ends without one."""
    async for out in stream:
        return out
    return None


async def _resumed(first: "RequestOutput | None",
                   stream: AsyncIterator["RequestOutput"]) -> AsyncIterator["RequestOutput"]:
    """``first`` (taken from ``stream`` already), then the rest of ``stream``; closing this
    closes ``stream`` (which aborts its request if it did not finish)."""
    try:
        if first is None:
            return
        yield first
        async for out in stream:
            yield out
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def _without_generation(stream: AsyncIterator["RequestOutput"]) -> AsyncIterator["RequestOutput"]:
    """``stream``'s outputs with the generated text and tokens dropped: an echo-only
    completion's one generated token is not part of its answer."""
    async for out in stream:
        for c in out.outputs:
            c.text, c.token_ids = "", []
            if c.logprobs is not None:
                c.logprobs = []
        yield out


def _refused_field(message: str, req: SamplingFields) -> str | None:
    """The request field an engine refusal (or a ``SamplingParams`` error) is about, by the
    request's own names: chat's ``top_logprobs`` and ``max_completion_tokens``,
    ``response_format`` or ``tools`` where it set the constraint, ``messages`` for a chat
    prompt."""
    chat = isinstance(req, ChatCompletionRequest)
    # "structured outputs: ..." is the engine core's, for a constraint its backend failed to compile.
    if message.startswith(("structured_outputs", "structured outputs")):
        if chat and (req.tool_choice == "required" or isinstance(req.tool_choice, NamedToolChoice)):
            return "tools"  # the constraint is the tools' schemas (a request has one constraint)
        by_format = req.response_format is not None and req.response_format.type != "text"
        return "response_format" if by_format else "structured_outputs"
    if message.startswith("the prompt"):
        return "messages" if chat else "prompt"
    # The engine's own checks of these: no reasoning markers; no KV connector.
    for field in ("thinking_token_budget", "kv_transfer_params"):
        if message.startswith(field):
            return field
    match = re.match(r"(?:(?:Sampling|BeamSearch)Params\.)?(\w+)(?:=|\[| has )", message)
    if match is None:
        return None
    field = match.group(1)
    if field == "beam_width":
        return "n"
    if chat and field == "logprobs":
        return "top_logprobs"
    if chat and field == "max_tokens" and req.max_completion_tokens is not None:
        return "max_completion_tokens"
    return field


def truncate_prompt(ids: list[int], req: SamplingFields, max_tokens: int | None, max_model_len: int) -> list[int]:
    """Apply ``truncate_prompt_tokens`` (vLLM semantics); bad values raise ``BadRequest``.

    ``-1`` keeps as many tokens as the context leaves room for next to ``max_tokens``
    (one generated token when it is not given); ``truncation_side`` ``"left"`` (the
    default) keeps the last tokens, ``"right"`` the first.
    """
    keep = req.truncate_prompt_tokens
    if keep is None:
        return ids
    room = max_model_len - (max_tokens or 1)
    if keep == -1:
        keep = room
    if not 0 < keep <= room:
        raise BadRequest(f"truncate_prompt_tokens={req.truncate_prompt_tokens} must be between 1 and "
                         f"max_model_len - max_tokens = {room} (or -1)", "truncate_prompt_tokens")
    if len(ids) <= keep:
        return ids
    return ids[-keep:] if (req.truncation_side or "left") == "left" else ids[:keep]


def _engine_prompt(ids: list[int], req: SamplingFields) -> list[int] | dict[str, Any]:
    """What the engine gets as the prompt: the token ids, in a vLLM ``TokensPrompt`` dict
    with the request's ``cache_salt`` when it has one."""
    if req.cache_salt is None:
        return ids
    return {"prompt_token_ids": ids, "cache_salt": req.cache_salt}


def _client_key(req: SamplingFields, raw_request: Any) -> str | None:
    """Who the scheduler's per-client share (``--max-prefill-tokens-per-client``) counts
    a request against: the OpenAI ``user`` field when given, else the peer's IP address.

    ``X-Forwarded-For`` is not read: any client can write it. Behind a proxy every
    request has the proxy's address, so the proxy should send ``user``. A client that sends
    a different ``user`` on each request counts as many clients: put a proxy that sets it in
    front of clients that cannot be trusted with it.
    """
    if req.user:
        return f"user:{req.user}"
    peer = getattr(raw_request, "client", None)
    host = getattr(peer, "host", None)
    return f"ip:{host}" if host else None


def _prompt_logprobs(out: "RequestOutput") -> PromptLogprobs | None:
    """``RequestOutput.prompt_logprobs`` for a response body (-inf, which JSON cannot
    carry, becomes -9999.0 as in vLLM)."""
    if out.prompt_logprobs is None:
        return None
    return [None if entry is None else {
        tok: PromptLogprob(logprob=_json_logprob(lp.logprob), rank=lp.rank, decoded_token=lp.decoded_token)
        for tok, lp in entry.items()} for entry in out.prompt_logprobs]


def _json_logprob(logprob: float) -> float:
    """A logprob JSON can carry: -inf (a token a grammar or a logit bias masks, listed among
    the top ones) and NaN become -9999.0, as in vLLM's answers."""
    return logprob if logprob >= -9999.0 else -9999.0


class _TextOffsets:
    """Where each token's text starts in a choice's text (``text_offset``), token by token.

    It replays the engine's incremental detokenization (same context tokens, same
    special-token rule), so the offsets index into the text the engine produced, also
    where one character spans several tokens: a token ending inside a character starts
    where that character will. Offsets never pass the text actually returned (a stop
    string may have cut it).

    Args:
        tokenizer: The model's tokenizer.
        context_ids: The tokens before the first one (the prompt, for generated tokens).
        skip_special_tokens, spaces_between_special_tokens: As the request's.
        base: Added to every offset (the echoed prompt's length).
    """

    def __init__(self, tokenizer: Any, context_ids: list[int], skip_special_tokens: bool,
                 spaces_between_special_tokens: bool = True, base: int = 0) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, context_ids, skip_special_tokens,
                                             spaces_between_special_tokens)
        self.base = base

    def advance(self, token_ids: Iterable[int], text_len: int) -> list[int]:
        """The offsets of the next tokens, in a text now ``text_len`` characters long (base excluded)."""
        offsets = []
        for token_id in token_ids:
            offsets.append(self.base + min(self._detok.num_chars, text_len))
            self._detok.update([token_id])
        return offsets


_UNCAPPED = 1 << 62  # advance()'s text length where offsets are cut later


def _join_logprobs(a: CompletionLogProbs, b: CompletionLogProbs) -> CompletionLogProbs:
    return CompletionLogProbs(text_offset=a.text_offset + b.text_offset, token_logprobs=a.token_logprobs
                              + b.token_logprobs, tokens=a.tokens + b.tokens, top_logprobs=a.top_logprobs
                              + b.top_logprobs)


class _StreamedChoice:
    """What a stream keeps of one choice between ``DELTA`` outputs.

    Attributes:
        token_ids, logprobs: Tokens received but not sent yet (their text is held back:
            a partial UTF-8 character, a possible stop string, a parser's hold-back).
        text_len: Characters of text received (all sent: the engine holds text back).
        num_tokens: Tokens received (usage).
        text, all_token_ids: The whole text and token ids, kept only for chat parsers.
    """

    __slots__ = ("token_ids", "logprobs", "text_len", "num_tokens", "text", "all_token_ids", "offsets")

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[Any] = []
        self.text_len = 0
        self.num_tokens = 0
        self.text = ""
        self.all_token_ids: list[int] = []
        # Completions with logprobs: where each unsent token's text starts (not capped).
        self.offsets: list[int] = []

    def receive(self, c: "CompletionOutput", keep_whole: bool = False) -> None:
        self.token_ids.extend(c.token_ids)
        if c.logprobs:
            self.logprobs.extend(c.logprobs)
        self.text_len += len(c.text)
        self.num_tokens += len(c.token_ids)
        if keep_whole:
            self.text += c.text
            self.all_token_ids.extend(c.token_ids)

    def take(self, index: int, count: int | None = None) -> "CompletionOutput":
        """The first ``count`` tokens not sent yet (default all), as a ``CompletionOutput``
        (for the logprobs helpers)."""
        from forkless.outputs import CompletionOutput

        count = len(self.token_ids) if count is None else count
        out = CompletionOutput(index=index, text="", token_ids=self.token_ids[:count],
                               logprobs=self.logprobs[:count])
        del self.token_ids[:count], self.logprobs[:count], self.offsets[:count]
        return out


def _usage_of(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
              reasoning_tokens: int | None = None) -> UsageInfo:
    """The usage; with ``prompt_tokens_details`` when ``cached_tokens`` is given, and
    ``completion_tokens_details`` when ``reasoning_tokens`` is."""
    details = PromptTokenUsageInfo(cached_tokens=cached_tokens) if cached_tokens is not None else None
    completion = CompletionTokenUsageInfo(reasoning_tokens=reasoning_tokens) if reasoning_tokens is not None else None
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens, prompt_tokens_details=details,
                     completion_tokens_details=completion)


def _usage(out: "RequestOutput", cached_tokens: int | None = None, reasoning_tokens: int | None = None) -> UsageInfo:
    """``out``'s usage; ``cached_tokens`` and ``reasoning_tokens`` as :func:`_usage_of`."""
    prompt = len(out.prompt_token_ids or [])
    completion = sum(len(c.token_ids) for c in out.outputs)
    return _usage_of(prompt, completion, cached_tokens, reasoning_tokens)


# Tokens of margin in max_text_chars: a text cut there still makes more tokens than
# truncation keeps, so the tokens at the cut (which may differ from the whole text's) go.
_TEXT_MARGIN_TOKENS = 16


def _text_chars(obj: Any) -> int:
    """Characters in all the strings of a JSON-like value (a conversation, tools)."""
    if isinstance(obj, str):
        return len(obj)
    if isinstance(obj, dict):
        return sum(_text_chars(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_text_chars(v) for v in obj)
    return 0


def _sse_error(message: str, err_type: str, code: int, param: str | None = None) -> str:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n"


def _sse_internal_error(exc: Exception, where: str) -> str:
    """The final event of a stream that failed on a bug (logged with its traceback)."""
    logger.error("%s failed", where, exc_info=exc)
    return _sse_error(f"internal error: {type(exc).__name__}: {exc}", "InternalServerError", 500)


def _sse(obj: Any) -> str:
    data = obj if isinstance(obj, str) else obj.model_dump_json(exclude_unset=False)
    return f"data: {data}\n\n"


_json_str = msgspec.json.Encoder().encode


class _TextChunks:
    """The SSE event of a completions chunk that carries text alone, written directly.

    Most chunks of a stream are that (no logprobs, not the last): building and dumping
    the pydantic ``CompletionResponse`` costs ~10 us a chunk, a large share of the API
    server's time per token with hundreds of streams. The JSON is the model's, field for
    field (a test compares them); the text goes through msgspec's JSON string encoder.
    """

    __slots__ = ("_head", "_tail")

    def __init__(self, request_id: str, created: int, model: str) -> None:
        head = CompletionStreamResponse(id=request_id, created=created, model=model, choices=[
            CompletionChoice(index=0, text="")]).model_dump_json(exclude_unset=False)
        # Split the model's own JSON around the choice's index and text.
        marker = '"choices":[{"index":0,"text":"",'
        at = head.index(marker)
        self._head = "data: " + head[:at] + '"choices":[{"index":'
        self._tail = "," + head[at + len(marker):] + "\n\n"

    def __call__(self, index: int, text: str) -> str:
        return f'{self._head}{index},"text":{_json_str(text).decode()}{self._tail}'


class OpenAIServing:
    """Completions and chat completions on top of an ``AsyncLLM``."""

    def __init__(self, engine: "AsyncLLM", served_model_names: list[str], max_model_len: int,
                 chat_options: ChatOptions | None = None,
                 max_sequences_per_request: int = DEFAULT_MAX_SEQUENCES_PER_REQUEST,
                 models: ServingModels | None = None, log_requests: bool = False,
                 enable_prompt_tokens_details: bool = False, return_tokens_as_token_ids: bool = False,
                 enable_force_include_usage: bool = False) -> None:
        self.engine = engine
        self.enable_force_include_usage = enable_force_include_usage  # --enable-force-include-usage
        self.log_requests = log_requests  # --enable-log-requests
        self.enable_prompt_tokens_details = enable_prompt_tokens_details  # --enable-prompt-tokens-details
        # --return-tokens-as-token-ids: the default of the request field of the same name.
        self.return_tokens_as_token_ids = return_tokens_as_token_ids
        # The model names requests may give: the served model's and its LoRA adapters'.
        self.models = models or ServingModels(engine, served_model_names, max_model_len)
        self.chat_options = chat_options or ChatOptions()
        self.served_model_names = served_model_names
        self.model_name = served_model_names[0]
        self.max_model_len = max_model_len
        self.max_sequences_per_request = max_sequences_per_request
        self._tokenizer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forkless-tokenizer")

    def reported_cached_tokens(self, num_cached_tokens: int | None, always: bool = False) -> int | None:
        """The ``usage.prompt_tokens_details.cached_tokens`` of a response, or ``None`` to
        leave ``prompt_tokens_details`` out.

        With ``--enable-prompt-tokens-details``, the prompt tokens found in the prefix
        cache when there are any: vLLM leaves the details out of a response whose prompt
        had no hit, and so does this. ``always`` (the Responses API, whose
        ``input_tokens_details`` are made from it): the count, 0 included, flag or not.
        """
        if always:
            return num_cached_tokens or 0
        return num_cached_tokens if self.enable_prompt_tokens_details and num_cached_tokens else None

    def include_usage(self, req: SamplingFields) -> bool:
        """Whether a stream ends with its usage: it asked (``stream_options.include_usage``)
        or the server always adds it (``--enable-force-include-usage``, as vLLM's)."""
        return bool(req.stream_options and req.stream_options.include_usage) or self.enable_force_include_usage

    def continuous_usage(self, req: SamplingFields) -> bool:
        """Whether every chunk of a stream carries its usage so far: vLLM's rule, asked with
        ``continuous_usage_stats`` and ``include_usage`` both (the first alone asks for
        nothing), and always with ``--enable-force-include-usage``."""
        if self.enable_force_include_usage:
            return True
        options = req.stream_options
        return bool(options and options.include_usage and options.continuous_usage_stats)

    async def in_tokenizer_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the tokenizer thread (see the module); its exceptions propagate."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, functools.partial(fn, *args))

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def tokens_as_ids(self, req: SamplingFields) -> bool:
        """Whether ``req``'s logprobs name tokens ``"token_id:N"``: its
        ``return_tokens_as_token_ids``, else ``--return-tokens-as-token-ids`` (vLLM's rule)."""
        asked = req.return_tokens_as_token_ids
        return self.return_tokens_as_token_ids if asked is None else asked

    def check_logprobs(self, field: str, asked: int | None) -> None:
        """Refuse a logprobs count that is not an integer >= -1 or over ``--max-logprobs``."""
        if asked is None:
            return
        if asked < -1:
            raise BadRequest(f"{field}={asked} is invalid: expected an integer >= 0, or -1 for the whole "
                             "vocabulary", field)
        mc = self.engine.config.model_config
        try:
            check_logprobs_count(field, asked, mc.max_logprobs, mc.vocab_size)
        except ValueError as exc:
            raise BadRequest(str(exc), field) from None

    @functools.cached_property
    def sampling_defaults(self) -> dict[str, Any]:
        """What requests sample with where they set nothing (``--generation-config``)."""
        return dict(self.engine.config.model_config.sampling_defaults)

    @functools.cached_property
    def max_text_chars(self) -> int:
        """Characters beyond which a text surely has more than ``max_model_len`` tokens.

        A token's text is at most as long as its vocabulary entry (byte-level BPE spells
        one byte per character, SentencePiece ``▁`` is one space), so a text makes at
        least ``len(text) / longest entry`` tokens.
        """
        longest = max(map(len, self.tokenizer.get_vocab()), default=1)
        return (self.max_model_len + _TEXT_MARGIN_TOKENS) * longest

    def check_text_size(self, chars: int, param: str, what: str | None = None) -> None:
        """Refuse text that could not fit the context, before tokenizing it.

        Raises:
            BadRequest: ``context_length_exceeded``, naming ``param`` (the message names
                ``what``, when given).
        """
        if chars > self.max_text_chars:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens, and {what or param} has "
                f"{chars} characters: more than {self.max_text_chars}, beyond which text always makes "
                "more tokens than that.", param, code="context_length_exceeded")

    def check_conversation_size(self, req: ChatCompletionRequest) -> None:
        """:meth:`check_text_size` for a conversation's messages and the tools the template
        renders with them (the error names the tools too when they count)."""
        messages = _text_chars([m.model_dump() for m in req.messages])
        tools = _text_chars(req.model_dump(include={"tools"})) if req.tools else 0
        self.check_text_size(messages + tools, "tools" if tools > messages else "messages",
                             "messages and tools together" if tools else None)

    def _bounded_text(self, text: str, req: CompletionRequest) -> str:
        """A completion prompt, cut to ``max_text_chars`` when truncation allows, else checked."""
        limit = self.max_text_chars
        if len(text) <= limit:
            return text
        if req.truncate_prompt_tokens is None:
            self.check_text_size(len(text), "prompt")
        # Truncation keeps at most max_model_len tokens; the cut text still has more.
        return text[-limit:] if (req.truncation_side or "left") == "left" else text[:limit]

    def _response_model(self, lora: LoRARequest | None) -> str:
        """The ``model`` a response names: the adapter's name for an adapter's request (as vLLM)."""
        return lora.lora_name if lora is not None else self.model_name

    async def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter a request's ``model`` names (``None``: the served model).

        Raises:
            BadRequest: HTTP 404 with type ``NotFoundError`` and code ``model_not_found``,
                as vLLM and OpenAI answer, so OpenAI clients raise ``NotFoundError``, for
                a model this server does not serve (nor a resolver finds).
        """
        return await self.models.resolve(model)

    def _default_max_tokens(self, prompt_len: int) -> int:
        return max(1, self.max_model_len - prompt_len)

    def _check_prompt(self, token_ids: list[int], max_tokens: int | None, max_tokens_field: str = "max_tokens",
                      prompt_field: str = "prompt") -> None:
        if not token_ids:
            raise BadRequest("the prompt is empty", prompt_field)
        if len(token_ids) >= self.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens, but the "
                f"prompt has {len(token_ids)} tokens; there is no room to generate.", prompt_field,
                code="context_length_exceeded")
        if max_tokens is not None and len(token_ids) + max_tokens > self.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. The "
                f"prompt has {len(token_ids)} tokens and {max_tokens_field} is {max_tokens}: "
                f"{len(token_ids) + max_tokens} in total.", max_tokens_field,
                code="context_length_exceeded")

    def check_sequences(self, num_prompts: int, n: int, inputs_param: str | None = None) -> None:
        """Refuse a request for more sequences (prompts × n) than the server allows.

        ``inputs_param``: a pooling request's field of inputs (each one a sequence), which
        the error then names.

        Raises:
            BadRequest: Naming ``n`` when it is above 1, else ``prompt`` (or ``inputs_param``).
        """
        if inputs_param is not None and num_prompts > self.max_sequences_per_request:
            raise BadRequest(
                f"this request has {num_prompts} inputs in {inputs_param}; this server takes at most "
                f"{self.max_sequences_per_request} per request (--max-sequences-per-request): send them in "
                "smaller batches", inputs_param)
        if num_prompts * n > self.max_sequences_per_request:
            raise BadRequest(
                f"this request asks for {num_prompts * n} sequences ({num_prompts} prompt(s) × n={n}); this "
                f"server generates at most {self.max_sequences_per_request} per request "
                "(--max-sequences-per-request)", "n" if n > 1 else "prompt")

    # -- completions ------------------------------------------------------------------
    @staticmethod
    def _prompt_list(req: CompletionRequest) -> list[str | list[int]]:
        """The request's prompts, untokenized: a string, a token-id list, or a list of either."""
        p = req.prompt
        if isinstance(p, str) or (isinstance(p, list) and p and all(isinstance(x, int) for x in p)):
            return [p]
        if not p:
            raise BadRequest("the prompt is empty", "prompt")
        return list(p)

    def _tokenize_prompts(self, prompts: list[str | list[int]]) -> list[list[int]]:
        return [list(p) if isinstance(p, list) else list(self.tokenizer.encode(p)) for p in prompts]

    async def create_completion(self, req: CompletionRequest, raw_request: Any) -> Any:
        lora = await self.check_model(req.model)
        if req.suffix:
            raise BadRequest("suffix is not supported", "suffix")
        texts = self._prompt_list(req)
        self.check_sequences(len(texts), req.n)
        check_unknown_fields(req)
        texts = [self._bounded_text(t, req) if isinstance(t, str) else t for t in texts]
        if any(isinstance(t, str) for t in texts):
            tokenized = await self.in_tokenizer_thread(self._tokenize_prompts, texts)
        else:  # token ids: nothing to wait for the tokenizer thread for
            tokenized = self._tokenize_prompts(texts)
        # echo with max_tokens=0 returns the prompt alone (vLLM's echo without generation, what
        # scoring harnesses use): one token is generated and dropped.
        echo_only = req.echo and req.max_tokens == 0 and not req.use_beam_search
        max_tokens = 1 if echo_only else req.max_tokens
        prompts = [truncate_prompt(ids, req, max_tokens, self.max_model_len) for ids in tokenized]
        # echo returns a text prompt as sent (as vLLM), not its tokens decoded: they differ
        # where the tokenizer adds a BOS or does not round-trip; a truncated prompt is decoded.
        echo_texts = [t if isinstance(t, str) and len(p) == len(ids) else None
                      for t, ids, p in zip(texts, tokenized, prompts)]
        for ids in prompts:
            self._check_prompt(ids, max_tokens)
        self.check_logprobs("logprobs", req.logprobs)
        self.check_logprobs("prompt_logprobs", req.prompt_logprobs)
        base_id, engine_id = _request_ids("cmpl", req.request_id, raw_request)
        if req.use_beam_search:
            params = [to_beam_search_params(req, max_tokens, self._default_max_tokens(len(ids)), req.logprobs,
                                            self.sampling_defaults) for ids in prompts]
        else:
            params = [to_sampling_params(req, max_tokens, req.logprobs, self._default_max_tokens(len(ids)),
                                         defaults=self.sampling_defaults) for ids in prompts]
        # One group_id: the scheduler's --max-running-seqs-per-request counts all the
        # prompts' sequences as one request's.
        client_key = _client_key(req, raw_request)
        for i, (ids, sp) in enumerate(zip(prompts, params)):
            self.log_request(f"{engine_id}-{i}", ids, sp)
        for sp in params:
            await self._check_constraint(req, sp)
        streams = [self._engine_stream(req, _engine_prompt(ids, req), sp, f"{engine_id}-{i}", lora, client_key,
                                       group_id=engine_id)
                   for i, (ids, sp) in enumerate(zip(prompts, params))]
        if req.stream:
            streams = await self._started(streams, params, req)
        else:
            await self.engine.send(streams)
        if echo_only:
            streams = [_without_generation(s) for s in streams]
        model_name = self._response_model(lora)
        if req.stream:
            return self._stream_completion(req, base_id, prompts, echo_texts, streams, raw_request, model_name)
        finals = await self._collect(streams, raw_request, req)
        choices = await self.in_tokenizer_thread(self._completion_choices, req, prompts, echo_texts, finals)
        usage = _usage_of(sum(len(out.prompt_token_ids or []) for out in finals),
                          sum(len(c.token_ids) for out in finals for c in out.outputs),
                          # (vLLM reports the last prompt's hits; here every prompt's count)
                          self.reported_cached_tokens(sum(out.num_cached_tokens or 0 for out in finals)))
        # (vLLM's: the first prompt's; a connector pairs one request.)
        return CompletionResponse(id=base_id, model=model_name, choices=choices, usage=usage,
                                  kv_transfer_params=finals[0].kv_transfer_params if finals else None)

    def _completion_choices(self, req: CompletionRequest, prompts: list[list[int]], echo_texts: list[str | None],
                            finals: list["RequestOutput"]) -> list[CompletionChoice]:
        """The choices of a finished completions request (runs in the tokenizer thread)."""
        choices = []
        as_ids = self.tokens_as_ids(req)
        with_ids = bool(req.return_token_ids)
        for p_idx, out in enumerate(finals):
            # As vLLM: with return_token_ids the echo is the prompt's ids, not its text.
            echo, echo_lp = (self._echo(prompts[p_idx], echo_texts[p_idx], out, req.logprobs, as_ids,
                                        with_text=not with_ids) if req.echo else ("", None))
            for c in out.outputs:
                lp = None
                if req.logprobs is not None:
                    offsets = _TextOffsets(self.tokenizer, prompts[p_idx], req.skip_special_tokens,
                                           req.spaces_between_special_tokens, base=len(echo))
                    lp = self._completion_logprobs(c, 0, req.logprobs, offsets.advance(c.token_ids, len(c.text)),
                                                   as_ids)
                    if echo_lp is not None:
                        lp = _join_logprobs(echo_lp, lp)
                choices.append(CompletionChoice(
                    index=p_idx * req.n + c.index, text=echo + c.text, finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason, logprobs=lp, prompt_logprobs=_prompt_logprobs(out),
                    prompt_token_ids=list(out.prompt_token_ids or prompts[p_idx]) if with_ids else None,
                    token_ids=list(c.token_ids) if with_ids else None))
        return choices

    def _completion_logprobs(self, c: "CompletionOutput", start: int, n: int | None,
                             offsets: list[int], as_ids: bool = False) -> CompletionLogProbs:
        """Logprobs of ``c``'s tokens from ``start`` on; ``offsets`` are their ``text_offset``s.
        ``as_ids``: tokens are named ``"token_id:N"`` (``return_tokens_as_token_ids``); the
        offsets still index the text."""
        lp = CompletionLogProbs(text_offset=offsets)
        for i in range(start, len(c.token_ids)):
            tok_id = c.token_ids[i]
            entries = (c.logprobs or [])[i] if c.logprobs and i < len(c.logprobs) else {}
            chosen = entries.get(tok_id)
            lp.tokens.append(self._token_text(tok_id, entries, as_ids))
            lp.token_logprobs.append(_json_logprob(chosen.logprob) if chosen else None)
            if n is None or (n == 0 and chosen is None):
                lp.top_logprobs.append(None)
            elif n == 0:  # the sampled token alone, as vLLM answers logprobs=0
                lp.top_logprobs.append({lp.tokens[-1]: _json_logprob(chosen.logprob)})
            else:
                # -1: the whole vocabulary (every entry the engine returned).
                top = sorted(entries.items(), key=lambda kv: kv[1].rank or 0)[: None if n == -1 else n + 1]
                lp.top_logprobs.append({self._token_text(t, entries, as_ids): _json_logprob(e.logprob)
                                        for t, e in top})
        return lp

    def _echo(self, prompt_ids: list[int], text: str | None, out: "RequestOutput", n: int | None,
              as_ids: bool = False, with_text: bool = True) -> tuple[str, CompletionLogProbs | None]:
        """The echoed prompt's text (``text``, the prompt as sent, else its tokens decoded;
        ``""`` without ``with_text``), and with ``logprobs`` its tokens in the completions
        ``logprobs`` format (as vLLM: the first token has neither a logprob nor top logprobs;
        offsets count the tokens' own text, capped to the text echoed; ``as_ids``: tokens
        named ``"token_id:N"``). Runs in the tokenizer thread: the prompt may be long."""
        from forkless.outputs import CompletionOutput

        if not with_text:
            text = ""
        elif text is None:
            text = self.tokenizer.decode(prompt_ids)
        if n is None:
            return text, None
        entries = [entry or {} for entry in out.prompt_logprobs or []]
        offsets = _TextOffsets(self.tokenizer, [], skip_special_tokens=False).advance(prompt_ids, len(text))
        lp = self._completion_logprobs(CompletionOutput(index=0, text="", token_ids=prompt_ids, logprobs=entries),
                                       0, n, offsets, as_ids)
        if lp.top_logprobs:
            lp.top_logprobs[0] = None
        return text, lp

    def _token_text(self, token_id: int, entries: dict, as_id: bool = False) -> str:
        """A token's name in logprobs: its text, or ``"token_id:N"`` with ``as_id``."""
        if as_id:
            return f"token_id:{token_id}"
        e = entries.get(token_id)
        if e is not None and e.decoded_token is not None:
            return e.decoded_token
        return self.tokenizer.decode([token_id])

    async def _stream_completion(self, req: CompletionRequest, base_id: str, prompts: list[list[int]],
                                 echo_texts: list[str | None], streams: list[AsyncIterator["RequestOutput"]], raw_request: Any,
                                 model_name: str) -> AsyncIterator[str]:
        created = int(time.time())
        echoes: dict[int, tuple[str, CompletionLogProbs | None]] = {}
        offsets: dict[int, _TextOffsets] = {}  # per choice: text_offset counts from its first chunk
        choices: dict[int, _StreamedChoice] = {}
        prompt_tokens: dict[int, int] = {}
        cached_tokens: dict[int, int] = {}  # per prompt: its tokens found in the prefix cache
        want_logprobs = req.logprobs is not None
        as_ids = self.tokens_as_ids(req)
        # return_token_ids: a choice's first chunk has its prompt's ids, every chunk its new
        # ids (vLLM's; here the echo is a chunk of its own, with no new ids).
        with_ids = bool(req.return_token_ids)
        prompt_ids_due: set[int] = set()  # choices whose first chunk is still to come
        # stream_options.continuous_usage_stats: every chunk carries its choice's usage so far.
        continuous = self.continuous_usage(req)
        text_chunk = _TextChunks(base_id, created, model_name)
        async for p_idx, out in self._merge_or_error(streams, raw_request, req):
            if isinstance(out, str):
                yield out
                return
            # DELTA outputs carry the completions that changed; every choice of a prompt
            # starts (echo, offsets) in index order with the prompt's first output.
            cached_tokens[p_idx] = out.num_cached_tokens or cached_tokens.get(p_idx, 0)
            if p_idx not in prompt_tokens:
                prompt_tokens[p_idx] = len(out.prompt_token_ids or [])
                by_index = {c.index: c for c in out.outputs}
                todo: Iterable[tuple[int, "CompletionOutput | None"]] = (
                    (i, by_index.get(i)) for i in range(req.n))
            else:
                todo = ((c.index, c) for c in out.outputs)
            for index, c in todo:
                idx = p_idx * req.n + index
                state = choices.get(idx)
                if state is None:
                    state = choices[idx] = _StreamedChoice()
                    echo, echo_lp = "", None
                    if req.echo:  # text may still be held back, so sent_text cannot say whether it was sent
                        if p_idx not in echoes:
                            echoes[p_idx] = await self.in_tokenizer_thread(
                                self._echo, prompts[p_idx], echo_texts[p_idx], out, req.logprobs, as_ids,
                                not with_ids)
                        echo, echo_lp = echoes[p_idx]
                        yield _sse(CompletionStreamResponse(id=base_id, created=created, model=model_name, choices=[
                            CompletionChoice(index=idx, text=echo, logprobs=echo_lp,
                                             prompt_token_ids=prompts[p_idx] if with_ids else None,
                                             token_ids=[] if with_ids else None)],
                            usage=_usage_of(prompt_tokens[p_idx], 0) if continuous else None))
                    elif with_ids:
                        prompt_ids_due.add(idx)
                    offsets[idx] = _TextOffsets(self.tokenizer, prompts[p_idx], req.skip_special_tokens,
                                                req.spaces_between_special_tokens, base=len(echo))
                if c is None:
                    continue
                state.receive(c)
                if want_logprobs:
                    state.offsets += offsets[idx].advance(c.token_ids, _UNCAPPED)
                if not c.text and not c.finish_reason:
                    continue  # tokens whose text is still held back (partial UTF-8, stop string)
                if not want_logprobs and c.finish_reason is None and not continuous and not with_ids:
                    state.token_ids.clear()
                    yield text_chunk(idx, c.text)
                    continue
                lp = None
                if want_logprobs:
                    # A token goes out with the chunk that releases the start of its text, so
                    # its text_offset is right even where a possible stop string held text
                    # back; at the end the rest go, cut to the text there is (as unstreamed).
                    end = offsets[idx].base + state.text_len
                    count = None if c.finish_reason else sum(1 for o in state.offsets if o < end)
                    sent = [min(o, end) for o in state.offsets[:count]]
                    taken = state.take(c.index, count)
                    lp = self._completion_logprobs(taken, 0, req.logprobs, sent, as_ids)
                else:
                    taken = state.take(c.index)
                first = idx in prompt_ids_due
                prompt_ids_due.discard(idx)
                chunk = CompletionStreamResponse(id=base_id, created=created, model=model_name, choices=[
                    CompletionChoice(index=idx, text=c.text, logprobs=lp, finish_reason=c.finish_reason,
                                     stop_reason=c.stop_reason, prompt_token_ids=prompts[p_idx] if first else None,
                                     # (the same tokens as the logprobs: see above)
                                     token_ids=list(taken.token_ids) if with_ids else None)],
                    usage=_usage_of(prompt_tokens[p_idx], state.num_tokens) if continuous else None)
                yield _sse(chunk)
        if self.include_usage(req):
            usage = _usage_of(sum(prompt_tokens.values()), sum(st.num_tokens for st in choices.values()),
                              self.reported_cached_tokens(sum(cached_tokens.values())))
            yield _sse(CompletionStreamResponse(id=base_id, created=created, model=model_name,
                                          choices=[], usage=usage))
        yield _sse("[DONE]")

    # -- tokenizer endpoints --------------------------------------------------------------
    async def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        """``/tokenize``: a prompt's or a conversation's token ids."""
        await self.check_model(req.model)
        check_unknown_fields(req)
        if req.messages is not None and req.prompt is not None:
            raise BadRequest("give either prompt or messages, not both", "prompt")
        if req.messages is not None:
            tokens = await self.messages_prompt(req, "/tokenize")
        elif req.prompt is not None:
            self.check_text_size(len(req.prompt), "prompt")
            tokens = await self.in_tokenizer_thread(
                functools.partial(self.tokenizer.encode, add_special_tokens=req.add_special_tokens), req.prompt)
        else:
            raise BadRequest("give either prompt or messages", "prompt")
        token_strs = self.tokenizer.convert_ids_to_tokens(list(tokens)) if req.return_token_strs else None
        return TokenizeResponse(count=len(tokens), max_model_len=self.max_model_len, tokens=list(tokens),
                                token_strs=token_strs)

    async def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        """``/detokenize``: the text of token ids."""
        await self.check_model(req.model)
        check_unknown_fields(req)
        return DetokenizeResponse(prompt=await self.in_tokenizer_thread(self._detokenize, req.tokens))

    def _detokenize(self, tokens: list[int]) -> str:
        vocab = len(self.tokenizer)
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"token ids out of range [0, {vocab}): {bad[:5]}", "tokens")
        return self.tokenizer.decode(tokens)

    # -- chat ---------------------------------------------------------------------------
    async def messages_prompt(self, req: Any, endpoint: str) -> list[int]:
        """The prompt token ids of the ``messages`` of a request that is not a chat completion
        (``/tokenize``, the pooling endpoints): the prompt a chat completion with the same
        fields gets. Its fields that a chat completion refuses are refused the same way.

        Args:
            req: A request with ``messages``, ``add_generation_prompt``,
                ``continue_final_message``, ``chat_template_kwargs``, ``add_special_tokens``
                and optionally ``tools``.
            endpoint: The endpoint, for the error of a model without a chat template.

        Raises:
            BadRequest: A refused field, text too long for the context, or a conversation
                the template cannot render.
        """
        _reject_unsupported_chat_tokenize(req)
        tools = getattr(req, "tools", None)
        chat = ChatCompletionRequest(messages=req.messages, add_generation_prompt=req.add_generation_prompt,
                                     continue_final_message=req.continue_final_message, tools=tools,
                                     chat_template=req.chat_template, chat_template_kwargs=req.chat_template_kwargs)
        self.check_conversation_size(chat)
        return await self.in_tokenizer_thread(self.render_chat, chat, endpoint)

    def check_request_chat_template(self, req: ChatCompletionRequest) -> None:
        """Refuse a request's own chat template (``chat_template``, or one passed in
        ``chat_template_kwargs``) unless the server trusts them
        (``--trust-request-chat-template``), in vLLM's words: a template is code that the
        server runs. Trusted, a template in ``chat_template_kwargs`` is still refused, as
        vLLM refuses it (give it as ``chat_template``), and so is ``tokenize`` there.

        Raises:
            BadRequest: Naming the field that carried the template.
        """
        in_kwargs = (req.chat_template_kwargs or {}).get("chat_template") is not None
        if not self.chat_options.trust_request_chat_template and (req.chat_template is not None or in_kwargs):
            raise BadRequest("Chat template is passed with request, but --trust-request-chat-template is not set. "
                             "Refused request with untrusted chat template.",
                             "chat_template" if req.chat_template is not None else "chat_template_kwargs")
        # As vLLM's: the server decides these, so a request's own are refused, not dropped
        # (and so are transformers' other apply_chat_template arguments, which are not
        # template variables: the server renders the template itself).
        unexpected = sorted(k for k in _SERVER_TEMPLATE_ARGS if k in (req.chat_template_kwargs or {}))
        if unexpected:
            raise BadRequest(f"Found unexpected chat template kwargs from request: {set(unexpected)} (the server "
                             "renders and tokenizes the conversation; these are not template variables)",
                             "chat_template_kwargs")

    def render_chat(self, req: ChatCompletionRequest, endpoint: str = "/v1/chat/completions") -> list[int]:
        """The prompt token ids of a conversation (blocking: call it in the tokenizer thread);
        ``endpoint`` names the request's endpoint in the error of a model without a chat
        template."""
        if not req.messages:
            raise BadRequest("messages must not be empty", "messages")
        self.check_request_chat_template(req)
        if req.continue_final_message and req.add_generation_prompt:
            raise BadRequest("continue_final_message and add_generation_prompt cannot both be true: give "
                             "add_generation_prompt=false to continue the last message", "continue_final_message")
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        tools = req.tools
        if (req.tool_choice == "none" and endpoint == "/v1/chat/completions"
                and self.chat_options.exclude_tools_when_tool_choice_none):
            # --exclude-tools-when-tool-choice-none: a model shown tools it may not call
            # tends to write calls anyway. As in vLLM, the Responses API keeps them.
            tools = None
        try:
            return self.engine.apply_chat_template(
                messages, add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                continue_final_message=req.continue_final_message,
                chat_template=req.chat_template or self.chat_options.chat_template,
                tools=[t.model_dump(exclude_none=True) for t in tools] if tools else None,
                documents=req.documents,
                chat_template_kwargs=_template_kwargs(req),
                content_format=self.chat_options.chat_template_content_format)
        except NoChatTemplateError:
            instead = {"/v1/chat/completions": "use /v1/completions with a plain prompt",
                       "/v1/responses": "use /v1/completions with a plain prompt",
                       "/tokenize": "send a plain prompt"}.get(endpoint, "send the text as input")
            raise BadRequest(
                f"this model has no chat template, so {endpoint} cannot turn messages into a "
                f"prompt: start the server with --chat-template PATH, or {instead}", "messages") from None
        except ValueError as exc:
            raise BadRequest(str(exc), "messages") from None

    def _tool_parser_for(self, req: ChatCompletionRequest, forced: str | None) -> str | None:
        """The tool parser to run on this request's output, after checking ``tool_choice``
        (``forced``: what :func:`forced_tool_choice` constrains the output to, if anything)."""
        opts = self.chat_options
        choice = req.tool_choice if req.tool_choice is not None else ("auto" if req.tools else "none")
        if choice == "required" or isinstance(choice, NamedToolChoice):
            # Constrained to the tools' schemas, ForcedToolCalls reads the calls; left
            # unconstrained (see _parser_reads_forced_calls), the tool parser does.
            return opts.tool_parser if forced is None else None
        if choice == "none" or not req.tools:
            return None
        if not (opts.enable_auto_tool_choice and opts.tool_parser):
            raise BadRequest('"auto" tool choice requires the server to be started with '
                             "--enable-auto-tool-choice and --tool-call-parser NAME", "tool_choice")
        return opts.tool_parser

    def _parser_reads_forced_calls(self) -> bool:
        """Whether ``tool_choice`` ``"required"`` or a named function goes unconstrained, its
        calls read by the ``--tool-call-parser``: vLLM's rule for a parser whose class sets
        ``supports_required_and_named = False`` (a model whose tool-call format is not the
        JSON array the constraint would force on it)."""
        name = self.chat_options.tool_parser
        if name is None:
            return False
        from forkless.tool_parsers import ToolParserManager

        return not ToolParserManager.get(name).supports_required_and_named

    def _choice_parsers(self, req: ChatCompletionRequest,
                        forced: str | None = None) -> tuple[list[ChoiceParser] | None, ChatCompletionRequest]:
        """The parsers of each choice, and the request as their ``adjust_request`` left it.

        As vLLM's server: the reasoning parser's ``adjust_request`` first, then the tool
        parser's, each given what the one before returned (a parser may change the request
        in place or return another one).
        """
        tool_parser = self._tool_parser_for(req, forced)
        reasoning_parser = self.chat_options.reasoning_parser
        if tool_parser is None and reasoning_parser is None and forced is None:
            return None, req
        parsers = [make_choice_parser(req, self.tokenizer, reasoning_parser, tool_parser,
                                      self.engine.config.model_config) for _ in range(req.n)]
        if forced is not None:
            for parser in parsers:
                parser.tools = ForcedToolCalls(forced)  # type: ignore[assignment]
        for hook in (parsers[0].reasoning, parsers[0].tools):
            if hook is not None:
                req = checked_return(hook, "adjust_request", hook.adjust_request(req), ChatCompletionRequest)
        for parser in parsers:
            parser.request = req
        return parsers, req

    async def create_chat_completion(self, req: ChatCompletionRequest, raw_request: Any,
                                     endpoint: str = "/v1/chat/completions",
                                     with_cached_tokens: bool = False, with_reasoning_tokens: bool = False,
                                     wait_for_start: bool = True) -> Any:
        """The chat completion (a response model), or its stream of SSE lines.

        Args:
            req: The request.
            raw_request: The HTTP request (headers, disconnection), or ``None``.
            endpoint: The endpoint the request came to: ``/v1/responses`` sends its
                requests here as chat completions, and the prompt is rendered for it.
            with_cached_tokens: Report ``usage.prompt_tokens_details.cached_tokens`` even
                without ``--enable-prompt-tokens-details``, 0 included (the Responses
                API's ``input_tokens_details`` are made from it).
            with_reasoning_tokens: Report ``usage.completion_tokens_details.reasoning_tokens``
                (the Responses API's ``output_tokens_details``) even without a reasoning
                parser (then 0); with one they are always reported: the tokens of the
                reasoning, as the parser counts them. In a stream, the last usage chunk
                has them.
            wait_for_start: A constrained stream is returned once it has its first
                output, so that a constraint the engine refuses is a 400 (see
                ``_started``); ``False`` returns it at once, the refusal then being its
                error event (a background response, which answers before it runs).

        Raises:
            BadRequest: The request is invalid (``param`` names the field).
        """
        lora = await self.check_model(req.model)
        self.check_sequences(1, req.n)
        check_unknown_fields(req)
        forced = forced_tool_choice(req)
        if forced is not None and self._parser_reads_forced_calls():
            forced = None
        named = forced not in (None, "required")
        parsers, req = self._choice_parsers(req, forced)
        # As vLLM's: with a reasoning parser, chat usage says how many tokens were reasoning.
        with_reasoning_tokens = with_reasoning_tokens or self.chat_options.reasoning_parser is not None
        self.check_conversation_size(req)
        ids = await self.in_tokenizer_thread(self.render_chat, req, endpoint)
        ids = truncate_prompt(ids, req, req.max_completion_tokens if req.max_completion_tokens is not None
                              else req.max_tokens, self.max_model_len)
        for parser in parsers or ():
            parser.set_prompt(ids)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        self._check_prompt(ids, max_tokens,
                           "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens",
                           "messages")
        top = req.top_logprobs if req.logprobs else None
        if req.top_logprobs and not req.logprobs:
            # (0 asks for nothing without logprobs, as vLLM takes it.)
            raise BadRequest("top_logprobs requires logprobs to be true", "top_logprobs")
        self.check_logprobs("top_logprobs", top)
        params: SamplingParams | BeamSearchParams
        if req.use_beam_search and forced is not None:
            raise BadRequest('tool_choice "required" or a named function constrains the output, which beam '
                             "search cannot do", "tool_choice")
        if req.use_beam_search:
            params = to_beam_search_params(req, max_tokens, self._default_max_tokens(len(ids)),
                                           (top or 0) if req.logprobs else None, self.sampling_defaults)
        else:
            params = to_sampling_params(req, max_tokens, (top or 0) if req.logprobs else None,
                                        self._default_max_tokens(len(ids)),
                                        tool_constraint(req, forced) if forced is not None else None,
                                        defaults=self.sampling_defaults)
        if isinstance(params, SamplingParams) and params.structured_outputs is not None:
            # The engine starts the constraint after the reasoning (as vLLM) where the
            # parser names its end token; else it holds from the first token, and there is
            # no reasoning to split off. A request that leaves the reasoning out has its
            # constraint hold from the first token (vLLM's reasoning_ended=True).
            if not req.include_reasoning:
                params.structured_outputs._reasoning_ended = True
            for parser in parsers or ():
                if parser.reasoning is not None and (parser.reasoning.end_token_id is None
                                                     or not req.include_reasoning):
                    parser.reasoning = None
        request_id, engine_id = _request_ids("chatcmpl", req.request_id, raw_request)
        self.log_request(engine_id, ids, params)
        await self._check_constraint(req, params)
        stream = self._engine_stream(req, _engine_prompt(ids, req), params, engine_id, lora,
                                     _client_key(req, raw_request))
        model_name = self._response_model(lora)
        if req.stream and wait_for_start:
            (stream,) = await self._started([stream], [params], req)
        else:
            await self.engine.send([stream])
        if req.stream:
            return self._stream_chat(req, request_id, stream, raw_request, model_name, parsers, ids, named,
                                     with_cached_tokens, with_reasoning_tokens)
        (final,) = await self._collect([stream], raw_request, req)
        choices = []
        role = self._reply_role(req)
        echo = _echoed(req, role)
        # include_reasoning=false (with a reasoning parser): no reasoning, and no per-token
        # logprobs or ids, which would show it (vLLM's rule).
        hidden = self._reasoning_hidden(req)
        as_ids = self.tokens_as_ids(req)
        for c in final.outputs:
            message = parsers[c.index].parse_whole(c.text) if parsers else ChatResponseMessage(content=c.text)
            message.role = role
            if hidden:
                message.reasoning = None
            if req.echo:  # (vLLM's: the content is "" rather than null with echo, even if nothing is echoed)
                message.content = echo + (message.content or "")
            choices.append(ChatChoice(
                index=c.index, message=message,
                finish_reason=_finish_reason(c.finish_reason, bool(message.tool_calls), named),
                stop_reason=c.stop_reason,
                logprobs=self._chat_logprobs(c, 0, top, as_ids) if req.logprobs and not hidden else None,
                token_ids=list(c.token_ids) if req.return_token_ids and not hidden else None))
        reasoning_tokens = (sum(parsers[c.index].reasoning_tokens(c.token_ids) if parsers else 0
                                for c in final.outputs) if with_reasoning_tokens else None)
        usage = _usage(final, self.reported_cached_tokens(final.num_cached_tokens, with_cached_tokens), reasoning_tokens)
        return ChatCompletionResponse(id=request_id, model=model_name, choices=choices, usage=usage,
                                      prompt_logprobs=_prompt_logprobs(final),
                                      prompt_token_ids=list(final.prompt_token_ids or ids) if req.return_token_ids
                                      else None, kv_transfer_params=final.kv_transfer_params)

    def _reasoning_hidden(self, req: ChatCompletionRequest) -> bool:
        """Whether ``req`` leaves its reasoning out of the reply (``include_reasoning=false``
        on a server with a reasoning parser: without one there is no reasoning to drop)."""
        return not req.include_reasoning and self.chat_options.reasoning_parser is not None

    async def _check_constraint(self, req: SamplingFields, params: SamplingParams | BeamSearchParams) -> None:
        """Check a structured-output constraint off the event loop, before the engine
        takes the request (its own check is then a lookup: see
        ``AsyncLLM.check_structured_outputs``).

        Raises:
            BadRequest: The constraint is invalid; ``param`` names the request's field.
        """
        from forkless.engine.async_llm import InvalidRequestError

        if isinstance(params, SamplingParams):
            try:
                await self.engine.check_structured_outputs(params)
            except InvalidRequestError as exc:
                param = _refused_field(str(exc), req)
                # The engine names the constraint by its own field, which this request did not send.
                message = (f"tools: tool_choice constrains the output to the tools' parameters, which the "
                           f"server cannot use as a constraint: {exc}" if param == "tools" else str(exc))
                raise BadRequest(message, param) from None

    def _engine_stream(self, req: SamplingFields, prompt: Any, params: SamplingParams | BeamSearchParams,
                       request_id: str, lora: LoRARequest | None, client_key: str,
                       group_id: str | None = None) -> AsyncIterator["RequestOutput"]:
        """The engine's output stream for one prompt: a generation, or a beam search
        (whose one output holds the ``n`` best beams as its completions).

        Raises:
            BadRequest: The engine refused the request; ``param`` names the request's field.
        """
        from forkless.engine.async_llm import InvalidRequestError

        try:
            if isinstance(params, BeamSearchParams):
                return self.engine.beam_search(prompt, request_id, params, lora_request=lora, priority=req.priority,
                                               client_key=client_key)
            return self.engine.generate(prompt, params, request_id, priority=req.priority, group_id=group_id,
                                        lora_request=lora, client_key=client_key)
        except InvalidRequestError as exc:
            raise BadRequest(str(exc), _refused_field(str(exc), req)) from None

    async def _started(self, streams: list[AsyncIterator["RequestOutput"]],
                       params: Sequence[SamplingParams | BeamSearchParams],
                       req: SamplingFields) -> list[AsyncIterator["RequestOutput"]]:
        """The streams of a streamed request, each past its first output where the engine
        may still refuse it after taking it: a constrained request's grammar compiles in
        the engine core, and a backend can refuse there what the API server's check
        passed (xgrammar's compiler refuses an empty EBNF alternative that llguidance's
        parser reads). Once the 200 and its headers are sent such a refusal could only be
        an error event inside the stream; waiting for the first output (or the refusal)
        makes it a 400, as unstreamed. Other streams are returned as they are, their
        requests sent (:meth:`AsyncLLM.send`), so that their response starts at once.

        Raises:
            BadRequest: The engine refused a request; ``param`` names ``req``'s field
                (every stream is closed, which aborts the others).
        """
        if not any(isinstance(p, SamplingParams) and p.structured_outputs is not None for p in params):
            await self.engine.send(streams)
            return streams
        from forkless.engine.async_llm import InvalidRequestError, gather_streams

        try:
            outputs = await gather_streams(streams, _first_output)
        except InvalidRequestError as exc:  # the other streams are closed, their requests aborted
            raise BadRequest(str(exc), _refused_field(str(exc), req)) from None
        return [_resumed(first, s) for first, s in zip(outputs, streams)]

    def log_request(self, request_id: str, prompt: list[int], params: Any) -> None:
        """With ``--enable-log-requests``, one line per engine request: its id, prompt length
        and parameters (not the prompt's text)."""
        if self.log_requests:
            logger.info("request %s: %d prompt tokens, %r", request_id, len(prompt), params)

    def _reply_role(self, req: ChatCompletionRequest) -> str:
        """``--response-role`` after a generation prompt; else the continued message's role (vLLM's rule)."""
        if req.add_generation_prompt and not req.continue_final_message:
            return self.chat_options.response_role
        return req.messages[-1].role

    def _chat_logprobs(self, c: "CompletionOutput", start: int, top: int | None, as_ids: bool = False) -> ChatLogprobs:
        """Chat logprobs of ``c``'s tokens from ``start`` on, ``top`` alternatives each.

        ``as_ids`` (``return_tokens_as_token_ids``) names every token ``"token_id:N"``; as
        vLLM, a sampled token's ``bytes`` stay its text's, an alternative's are its name's.
        """
        content = []
        for i in range(start, len(c.token_ids)):
            tok_id = c.token_ids[i]
            entries = c.logprobs[i] if c.logprobs and i < len(c.logprobs) else {}
            text = self._token_text(tok_id, entries)
            token = self._token_text(tok_id, entries, as_ids) if as_ids else text
            chosen = entries.get(tok_id)
            ranked = sorted(entries.items(), key=lambda kv: kv[1].rank or 0)
            names = [(self._token_text(t, entries, as_ids), e) for t, e in ranked
                     if top == -1 or (e.rank or 0) <= (top or 0)][: None if top == -1 else top or 0]
            tops = [TopLogprob(token=name, logprob=_json_logprob(e.logprob), bytes=list(name.encode()))
                    for name, e in names]
            content.append(ChatTokenLogprob(token=token, logprob=_json_logprob(chosen.logprob) if chosen else -9999.0,
                                            bytes=list(text.encode()), top_logprobs=tops))
        return ChatLogprobs(content=content)

    async def _stream_chat(self, req: ChatCompletionRequest, request_id: str,
                           stream: AsyncIterator["RequestOutput"], raw_request: Any, model_name: str,
                           parsers: list[ChoiceParser] | None = None,
                           prompt_ids: Sequence[int] = (), named: bool = False,
                           with_cached_tokens: bool = False,
                           with_reasoning_tokens: bool = False) -> AsyncIterator[str]:
        created = int(time.time())
        top = req.top_logprobs if req.logprobs else None
        continuous = self.continuous_usage(req)
        num_prompt_tokens = len(prompt_ids)
        hidden = self._reasoning_hidden(req)
        # return_token_ids: each choice's role chunk has the prompt's ids, every later chunk
        # its new ids (vLLM's), unless the reasoning is hidden: its ids would show it.
        with_ids = bool(req.return_token_ids) and not hidden
        as_ids = self.tokens_as_ids(req)

        def chunk(choices: list[ChatStreamChoice], usage: UsageInfo | None = None,
                  prompt_token_ids: list[int] | None = None) -> str:
            return _sse(ChatCompletionChunk(id=request_id, created=created, model=model_name,
                                            choices=choices, usage=usage, prompt_token_ids=prompt_token_ids))

        role = self._reply_role(req)
        for i in range(req.n):
            yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(role=role, content=""))],
                        usage=_usage_of(num_prompt_tokens, 0) if continuous else None,
                        prompt_token_ids=list(prompt_ids) if req.return_token_ids else None)
        echo = _echoed(req, role)
        if echo:  # as vLLM: one chunk per choice, after the roles, before anything generated
            for i in range(req.n):
                yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(content=echo))],
                            usage=_usage_of(num_prompt_tokens, 0) if continuous else None)
        choices = [_StreamedChoice() for _ in range(req.n)]
        # The parsers read the whole text and token ids (and so does the reasoning count).
        keep_whole = parsers is not None
        prompt_tokens = None
        cached_tokens = 0
        outputs = self._merge_or_error([stream], raw_request, req)
        try:
            async for _, out in outputs:
                if isinstance(out, str):
                    yield out
                    return
                if prompt_tokens is None:
                    prompt_tokens = len(out.prompt_token_ids or [])
                cached_tokens = out.num_cached_tokens or cached_tokens
                for c in out.outputs:
                    state = choices[c.index]
                    state.receive(c, keep_whole)
                    delta = c.text
                    if not delta and not c.finish_reason:
                        continue
                    pending = state.take(c.index)
                    lp = self._chat_logprobs(pending, 0, top, as_ids) if req.logprobs and not hidden else None
                    finish = c.finish_reason
                    if parsers is None:
                        message: DeltaMessage | None = DeltaMessage(content=delta)
                    else:
                        parser = parsers[c.index]
                        message = _merge_deltas(parser.step(state.text, list(state.all_token_ids)),
                                                parser.finish(state.text) if finish else None)
                        if hidden:
                            message = _without_reasoning(message)
                        finish = _finish_reason(finish, parser.called_tools, named)
                        if message is None and not finish and lp is None and not with_ids:
                            continue  # the parsers hold this text back for now
                    yield chunk([ChatStreamChoice(index=c.index, delta=message or DeltaMessage(), logprobs=lp,
                                                  finish_reason=finish, stop_reason=c.stop_reason,
                                                  token_ids=list(pending.token_ids) if with_ids else None)],
                                usage=_usage_of(prompt_tokens, state.num_tokens,
                                                cached_tokens if with_cached_tokens else None) if continuous else None)
        except Exception as exc:  # noqa: BLE001 - a parser's bug (a plugin's, often): the client is told
            # The response has started: an error event ends it, as vLLM's does, where the
            # connection would otherwise just drop.
            yield _sse_internal_error(exc, "chat stream")
            return
        finally:
            await outputs.aclose()  # aborts the engine request if it did not finish
        if self.include_usage(req) and prompt_tokens is not None:
            reasoning_tokens = (sum(parsers[i].reasoning_tokens(st.all_token_ids) if parsers else 0
                                    for i, st in enumerate(choices)) if with_reasoning_tokens else None)
            yield chunk([], usage=_usage_of(prompt_tokens, sum(st.num_tokens for st in choices),
                                            self.reported_cached_tokens(cached_tokens, with_cached_tokens),
                                            reasoning_tokens))
        yield _sse("[DONE]")

    # -- plumbing -----------------------------------------------------------------------
    async def _merge(self, streams: list[AsyncIterator["RequestOutput"]],
                     raw_request: Any) -> AsyncIterator[tuple[int, "RequestOutput"]]:
        """Interleave several engine streams, tagging each output with its stream index."""
        if len(streams) == 1:  # the common case: no pump task and queue hop per output
            try:
                async for out in streams[0]:
                    yield 0, out
            finally:
                aclose = getattr(streams[0], "aclose", None)
                if aclose is not None:
                    await aclose()  # aborts the request if it did not finish
            return
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        done = object()

        async def pump(i: int, s: AsyncIterator["RequestOutput"]) -> None:
            try:
                async for out in s:
                    await queue.put((i, out))
            except BaseException as exc:  # noqa: BLE001 - forwarded to the consumer
                await queue.put((i, exc))
                return
            await queue.put((i, done))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        remaining = len(tasks)
        try:
            while remaining:
                i, item = await queue.get()
                if item is done:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield i, item
        finally:
            # Aborts the requests that did not finish (client gone, or an error in a
            # sibling stream).
            from forkless.engine.async_llm import close_streams

            await close_streams(tasks, streams)

    async def _merge_or_error(self, streams: list[AsyncIterator["RequestOutput"]], raw_request: Any,
                              req: SamplingFields | None = None) -> AsyncIterator[tuple[int, Any]]:
        """Like ``_merge``, but an error after the response started becomes a final SSE
        error event (the HTTP status is already sent) followed by ``[DONE]``; a refusal
        names ``req``'s field it is about."""
        from forkless.engine.async_llm import EngineDeadError, InvalidRequestError, RequestFailedError

        try:
            async for item in self._merge(streams, raw_request):
                yield item
        except (InvalidRequestError, BadRequest) as exc:
            param = getattr(exc, "param", None) or (_refused_field(str(exc), req) if req is not None else None)
            yield -1, _sse_error(str(exc), "BadRequestError", 400, param)
        except EngineDeadError as exc:
            yield -1, _sse_error(str(exc), "ServiceUnavailableError", 503)
        except RequestFailedError as exc:  # (the engine logged why)
            yield -1, _sse_error(str(exc), error_type(exc.status), exc.status)
        except Exception as exc:  # noqa: BLE001 - reported to the client, and logged
            yield -1, _sse_internal_error(exc, "stream")

    async def _collect(self, streams: list[AsyncIterator["RequestOutput"]], raw_request: Any,
                       req: SamplingFields | None = None) -> list["RequestOutput"]:
        """The streams' final outputs.

        Raises:
            BadRequest: The engine refused a request after taking it (a constraint its
                backend could not compile); ``param`` names ``req``'s field.
        """
        from forkless.engine.async_llm import InvalidRequestError

        finals: dict[int, "RequestOutput"] = {}
        try:
            async for i, out in self._merge(streams, raw_request):
                finals[i] = out
        except InvalidRequestError as exc:
            raise BadRequest(str(exc), _refused_field(str(exc), req) if req is not None else None) from None
        return [finals[i] for i in range(len(streams))]


def _template_kwargs(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The chat template's extra variables: ``chat_template_kwargs``, and as vLLM gives them,
    ``reasoning_effort`` with ``enable_thinking`` (off for ``"none"``) unless the request's
    ``chat_template_kwargs`` set that (templates that declare neither ignore them)."""
    effort = req.reasoning_effort
    if effort is None:
        return req.chat_template_kwargs
    kwargs = {**(req.chat_template_kwargs or {}), "reasoning_effort": effort}
    kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs


def _finish_reason(reason: str | None, called_tools: bool, named: bool = False) -> str | None:
    # A generation that stopped by itself after calling tools is a tool-call turn; one cut
    # by max_tokens stays "length" so clients know the call may be truncated. A named
    # tool_choice ends with "stop", as OpenAI and vLLM answer it.
    return "tool_calls" if called_tools and reason == "stop" and not named else reason


def _merge_deltas(a: DeltaMessage | None, b: DeltaMessage | None) -> DeltaMessage | None:
    """One delta carrying ``a`` then ``b`` (a step's delta and the end-of-stream top-up)."""
    if a is None or b is None:
        return a or b
    join = lambda x, y: (x or "") + (y or "") or None  # noqa: E731
    calls = list(a.tool_calls or []) + list(b.tool_calls or [])
    return DeltaMessage(reasoning=join(a.reasoning, b.reasoning),
                        content=join(a.content, b.content), tool_calls=calls or None)


def _without_reasoning(delta: DeltaMessage | None) -> DeltaMessage | None:
    """``delta`` without its reasoning (``include_reasoning=false``); ``None`` if nothing is left."""
    if delta is None or (delta.content is None and not delta.tool_calls):
        return None
    delta.reasoning = None
    return delta


def _echoed(req: ChatCompletionRequest, role: str) -> str:
    """What a chat ``echo`` puts before each reply: the last message's content (its text
    parts joined by newlines) when that message has the reply's ``role``, else nothing
    (vLLM's rule)."""
    last = req.messages[-1]
    if not req.echo or last.role != role:
        return ""
    return message_text(last.content)


# chat_template_kwargs a request may not set: vLLM's two, and the rest of transformers'
# apply_chat_template arguments that are not template variables.
_SERVER_TEMPLATE_ARGS = ("chat_template", "tokenize", "return_dict", "return_tensors", "padding", "truncation",
                         "max_length", "tokenizer_kwargs", "return_assistant_tokens_mask")


# An engine id _request_ids made from a client's id: response id, then a random suffix.
_CLIENT_ENGINE_ID = re.compile(r"(?P<public>(?:cmpl|chatcmpl)-(?P<client>.+))-[0-9a-f]{32}")


def request_names(engine_id: str) -> set[str]:
    """The ids a client may know the request of ``engine_id`` by (``/abort_requests``): the
    engine's, the response's and, where the client gave one, its own (:func:`_request_ids`
    read backwards; a completion's engine ids add the prompt's index)."""
    base = engine_id.rsplit("-", 1)[0] if engine_id.startswith("cmpl-") else engine_id
    match = _CLIENT_ENGINE_ID.fullmatch(base)
    return {engine_id, match["public"], match["client"]} if match else {engine_id, base}


def _request_ids(prefix: str, client_id: str | None, raw_request: Any = None) -> tuple[str, str]:
    """``(response id, engine request id)``.

    A client's id, its ``X-Request-Id`` header or else the body's ``request_id`` (vLLM's
    order), becomes the response id (``prefix-id``); the engine id adds a random suffix,
    because two clients may send the same id at once and the engine needs it unique.
    """
    header = raw_request.headers.get("x-request-id") if raw_request is not None else None
    if header is not None:
        if not header:
            raise BadRequest("the X-Request-Id header must not be empty (leave it out for a generated id)",
                             "X-Request-Id")
        client_id = header
    if client_id is None:
        rid = random_id(prefix)
        return rid, rid
    if not client_id:
        raise BadRequest("request_id must not be empty (leave it out for a generated one)", "request_id")
    public = f"{prefix}-{client_id}"
    return public, random_id(public)
