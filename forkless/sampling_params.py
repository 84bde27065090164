"""Per-request sampling parameters (vLLM-compatible names and defaults).

``SamplingParams`` is a ``msgspec.Struct`` because it crosses the API server -> engine core
socket as msgpack; decoding runs ``__post_init__``, so a bad value is rejected on either
side of the socket with the same message. For the same reason everything in it must be
plain data msgpack can carry (``extra_args`` is checked), and every field has one spelling
once constructed: ``stop`` / ``stop_token_ids`` / ``bad_words`` are lists (empty when not
given, as vLLM's), ``seed`` -1 is ``None`` and ``logprobs=True`` is 1 (vLLM's aliases).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
from typing import Any

import msgspec

# Below this temperature a request is sampled greedily (argmax); dividing by a temperature
# this small would only turn the distribution into a one-hot anyway.
SAMPLING_EPS = 1e-5

# vLLM's default VLLM_MAX_NUM_BAD_WORDS. The bad-words processor checks every word of a
# row on every step in Python, so one request with thousands of words would slow the
# whole batch down.
MAX_BAD_WORDS = 128


class SamplingType(enum.IntEnum):
    """How the sampler treats a request's row."""

    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class RequestOutputKind(enum.IntEnum):
    """What each streamed ``RequestOutput`` carries (vLLM semantics)."""

    CUMULATIVE = 0  # everything generated so far
    DELTA = 1  # only what is new since the previous output
    FINAL_ONLY = 2  # nothing until the request finishes


def _bad(field: str, value: Any, expected: str, owner: str = "SamplingParams") -> ValueError:
    return ValueError(f"{owner}.{field}={value!r} is invalid: expected {expected}")


# vLLM ``SamplingParams`` arguments (current and older releases) that forkless does not
# implement -> (the values that ask for nothing, what to do instead). Code written for
# vLLM that passes such a value gets a ValueError saying so, instead of Python's bare
# "unexpected keyword argument"; the do-nothing values are accepted and dropped.
_UNSUPPORTED_ARGS: dict[str, tuple[tuple[Any, ...], str]] = {
    "guided_decoding": ((None,), "vLLM replaced it with structured_outputs=StructuredOutputsParams(...)"),
    "logprob_token_ids": ((None,), "not implemented; use logprobs"),
    "prompt_logprob_token_ids": ((None,), "not implemented; use prompt_logprobs"),
    "prompt_logprob_start": ((None, 0), "prompt logprobs always start at the first prompt token"),
    "flat_logprobs": ((False,), "logprobs are always lists of dicts"),
    "repetition_detection": ((None,), "not implemented"),
    "trace_decode_token_ids": ((None,), "not implemented"),
    "routed_experts_prompt_start": ((0,), "routed experts are not returned"),
    "skip_reading_prefix_cache": ((None,), "a request skips the prefix cache exactly when it asks for prompt_logprobs"),
    "skip_clone": ((False, True), ""),
    "truncate_prompt_tokens": ((None,), "pass tokenization_kwargs={'truncate_prompt_tokens': N} to "
                                        "LLM.generate / LLM.chat, as vLLM now takes it (the OpenAI server "
                                        "takes the request field truncate_prompt_tokens)"),
    "best_of": ((None, 1), "vLLM removed it; use n"),
    "use_beam_search": ((False,), "use LLM.beam_search(prompts, BeamSearchParams(...)), as vLLM"),
    "length_penalty": ((1.0,), "it only applies to beam search: use LLM.beam_search with "
                               "BeamSearchParams(length_penalty=...)"),
    "early_stopping": ((False,), "beam search (LLM.beam_search) runs every beam to max_tokens or EOS, "
                                 "as vLLM's"),
    "watermarking": ((None, False), "not implemented"),
    "logits_processors": ((None, []), "per-request callables are not supported; select batch-level "
                                      "processors with --logits-processors and pass arguments in extra_args"),
}


class StructuredOutputsParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A constraint on what a request may generate (vLLM's ``StructuredOutputsParams``).

    Exactly one of ``json``, ``regex``, ``choice``, ``grammar`` or ``json_object`` is
    set. The engine compiles it into a grammar (``--structured-outputs-config``'s backend)
    and masks, at every step, the tokens that would leave it; the request finishes with
    ``stop`` when the grammar is complete.

    Attributes:
        json: A JSON schema (a dict, or its JSON text): the output is one JSON value valid
            against it.
        regex: A regular expression the whole output matches.
        choice: The output is exactly one of these strings.
        grammar: A context-free grammar: EBNF (xgrammar's GBNF dialect, ``root ::= ...``)
            or Lark (``start: ...``; the guidance backend reads both).
        json_object: ``True``: any JSON object.
        disable_fallback: With backend ``auto``, fail instead of falling back to another
            backend when the first cannot handle the constraint.
        disable_any_whitespace: No whitespace between JSON tokens (compact JSON).
        disable_additional_properties: JSON objects have only the schema's properties,
            as if every object schema said ``"additionalProperties": false``.
        whitespace_pattern: Not supported (a ValueError says so), as vLLM's v1 engine.
        structural_tag: Not supported (a ValueError says so).
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None
    # The backend the API server chose for this request ("auto" resolved); filled in by
    # validation, read by the engine core. Not for users (vLLM's name).
    _backend: str | None = None
    # Set by the API server for a chat request with include_reasoning=false (vLLM's
    # reasoning_ended=True): the grammar holds from the first token, even with a reasoning
    # parser and a prompt that leaves the model thinking. Not for users.
    _reasoning_ended: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.choice, tuple):
            self.choice = list(self.choice)
        for name in ("json_object", "disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (value is None and name == "json_object"):
                raise ValueError(f"StructuredOutputsParams.{name}={value!r:.80} is invalid: expected true or false")
        kinds = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        if self.json_object:
            kinds.append("json_object")
        if self.structural_tag is not None:
            raise ValueError("StructuredOutputsParams.structural_tag is not supported by forkless; use json, "
                             "regex, choice or grammar")
        if self.whitespace_pattern is not None:
            raise ValueError("StructuredOutputsParams.whitespace_pattern is not supported (as in vLLM's v1 "
                             "engine); use disable_any_whitespace=True for compact JSON")
        if len(kinds) != 1:
            raise ValueError(
                "StructuredOutputsParams needs exactly one of json, regex, choice, grammar or json_object=True; "
                f"got {', '.join(kinds) if kinds else 'none'}")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError(f"StructuredOutputsParams.json={self.json!r:.80} is invalid: expected a JSON schema "
                             "(a dict or its JSON text)")
        if isinstance(self.json, dict):
            error = _msgpack_error(self.json)  # (refused here, not as a server error)
            if error is not None:
                raise ValueError(f"StructuredOutputsParams.json={self.json!r:.80} is invalid: expected a JSON schema "
                                 f"of plain JSON values whose integers fit in 64 bits: {error}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"StructuredOutputsParams.{name}={value!r:.80} is invalid: expected a non-empty "
                                 "string")
        if self.choice is not None and (
            not isinstance(self.choice, list) or not self.choice
            or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError(f"StructuredOutputsParams.choice={self.choice!r:.80} is invalid: expected a "
                             "non-empty list of non-empty strings")

    @property
    def kind(self) -> str:
        """Which constraint this is: ``json``, ``regex``, ``choice``, ``grammar`` or ``json_object``."""
        for name in ("json", "regex", "choice", "grammar"):
            if getattr(self, name) is not None:
                return name
        return "json_object"


class _SamplingParamsMeta(type(msgspec.Struct)):  # type: ignore[misc]
    """Turns vLLM-only arguments into clear errors (a Struct cannot define ``__init__``)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        for name in [k for k in kwargs if k in _UNSUPPORTED_ARGS]:
            accepted, instead = _UNSUPPORTED_ARGS[name]
            value = kwargs.pop(name)
            if value not in accepted:
                raise ValueError(f"SamplingParams.{name}={value!r} is not supported by forkless: {instead}")
        return super().__call__(*args, **kwargs)


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True, metaclass=_SamplingParamsMeta):
    """Sampling parameters of one request.

    Names, meanings and defaults follow vLLM so that its users feel at home.

    Attributes:
        n: Number of completions to generate for the prompt.
        temperature: Softmax temperature in [0, 2] (vLLM's range); below ``SAMPLING_EPS``
            (e.g. 0) means greedy, which allows only ``n=1`` (vLLM's rule: greedy
            completions would all be the same).
        top_p: Keep the smallest set of tokens whose probability sums to at least top_p.
        top_k: Keep the k most likely tokens; 0 or -1 disables it (-1 is kept as given,
            as vLLM keeps it).
        min_p: Drop tokens whose probability is below ``min_p * max_probability``.
        seed: Seeds this request's own random generator: the same seed and prompt give
            the same tokens whatever else shares the batch. -1 means unseeded (``None``),
            as in vLLM.
        max_tokens: Maximum number of generated tokens; ``None`` means up to the model's
            context length.
        min_tokens: EOS and ``stop_token_ids`` are masked until this many tokens exist,
            and stop strings are looked for only in the text of later tokens (vLLM's
            rules; 0 with ``structured_outputs``, whose grammar decides where the output ends).
        stop: Strings that end generation (normalized to a list; ``[]`` when not given).
            When several complete in one step, the one that ends first wins, then the one
            listed first (vLLM's rule).
        stop_token_ids: Token ids that end generation (the token is kept in the output);
            ``[]`` when not given.
        ignore_eos: Keep generating after the model's EOS token.
        logprobs: Number of top log-probabilities to return per generated token, besides
            the sampled token's own; ``None`` returns none; -1 the whole vocabulary; ``True``
            is 1 (vLLM's). At most the engine's ``max_logprobs`` (``--max-logprobs``,
            default 20).
        prompt_logprobs: Number of top log-probabilities to return per prompt token,
            besides the prompt token's own (-1: the whole vocabulary; ``True``: 1;
            ``RequestOutput.prompt_logprobs``; the first prompt token has none). They are
            the model's raw distribution. A request that asks for them does not read the
            prefix cache: every prompt position must be computed to have logits.
        presence_penalty: Subtracted once from every token already generated ([-2, 2]).
        frequency_penalty: Subtracted per occurrence of a generated token ([-2, 2]).
        repetition_penalty: Divides positive / multiplies negative logits of tokens seen
            in the prompt or the output (> 0; 1 disables it).
        logit_bias: Token id -> value added to its logit before sampling.
        allowed_token_ids: When set, only these token ids can be sampled (ids must be in
            the vocabulary; checked when the request is accepted).
        bad_words: Words that must not be generated (``[]`` when not given). Each is
            tokenized without and with a leading space (``update_from_tokenizer``); the
            last token of such a sequence is banned whenever the generated output ends
            with the tokens before it, so a one-token word is always banned. Only
            generated tokens count, not the prompt.
        detokenize: Turn generated tokens into text. ``False`` returns token ids only
            (empty ``text``, no ``decoded_token`` in logprobs) and skips the per-token
            detokenization cost; ``stop`` strings need text, so they require ``True``.
        skip_special_tokens: Omit special tokens when detokenizing.
        spaces_between_special_tokens: Put spaces around kept special (added) tokens when
            detokenizing with a slow tokenizer; fast tokenizers ignore it, as in vLLM and
            transformers.
        include_stop_str_in_output: Keep the matched stop string in the text.
        output_kind: What each streamed output carries.
        extra_args: Free-form arguments for custom logits processors; each processor
            validates its own keys in ``LogitsProcessor.validate_params``. Plain data that
            msgpack carries (integers within [-2**63, 2**64), as vLLM checks), since it
            crosses to the engine core and the workers.
        eos_token_ids: The model's EOS token ids; the engine fills this from the
            generation config (``update_from_generation_config``), users need not.
        structured_outputs: Constrain the output to a JSON schema, regex, choice or
            grammar (:class:`StructuredOutputsParams`); ``None``: unconstrained.
        bad_words_token_ids: ``bad_words`` as token sequences; filled by
            ``update_from_tokenizer`` (the model runner calls it when it is unset).
        thinking_token_budget: The most reasoning tokens (vLLM's): once this many follow
            the reasoning's start marker, the engine forces its end marker, and the model
            answers. ``None`` (or -1): no limit. Needs the engine's reasoning markers
            (``--reasoning-parser`` and / or ``--reasoning-config``).
        reasoning_start_token_ids: The start marker's token ids; the engine fills both
            markers from its reasoning configuration for a request with a budget, users
            need not.
        reasoning_end_token_ids: The end marker's token ids (forced when the budget is spent).
        stream_interval: With ``DELTA`` outputs, a request's next output comes once this
            many tokens are new (its first and last at once); ``None``: every step's. The
            engine's ``stream_interval`` (``--stream-interval``) is the least it can be
            (vLLM's rule: the larger of the two counts). No effect on other output kinds.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    # Lists by default, as vLLM's (``None`` given is made ``[]`` too); omit_defaults leaves
    # an empty one off the wire, as it left None.
    stop: str | list[str] | None = msgspec.field(default_factory=list)
    stop_token_ids: list[int] | None = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = msgspec.field(default_factory=list)
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    extra_args: dict[str, Any] | None = None
    eos_token_ids: list[int] | None = None
    bad_words_token_ids: list[list[int]] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    thinking_token_budget: int | None = None
    reasoning_start_token_ids: list[int] | None = None
    reasoning_end_token_ids: list[int] | None = None
    stream_interval: int | None = None

    @classmethod
    def from_optional(cls, **kwargs: Any) -> "SamplingParams":
        """``SamplingParams(**kwargs)`` where an argument given as ``None`` takes its default
        (vLLM's ``SamplingParams.from_optional``, for request fields that may be null),
        except ``max_tokens``, whose ``None`` stays "up to the context length", as in vLLM.

        As vLLM's, it also clamps each ``logit_bias`` value into [-100, 100] (OpenAI's range).

        Args:
            **kwargs: Any ``SamplingParams`` argument, by name.

        Returns:
            The parameters, validated as the constructor validates them.

        Raises:
            ValueError: As the constructor (the message names the argument).
        """
        given = {name: value for name, value in kwargs.items() if value is not None or name == "max_tokens"}
        bias = given.get("logit_bias")
        if isinstance(bias, dict):
            given["logit_bias"] = {tok: min(100.0, max(-100.0, value)) if isinstance(value, (int, float)) else value
                                   for tok, value in bias.items()}
        return cls(**given)

    def __post_init__(self) -> None:
        # Normalize first so that validate() and every consumer see one spelling.
        # Lists from a tuple or set too, but not from a string or a number (list("12") would
        # be two stop ids, list(5) a TypeError): those are validate()'s error naming the field.
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, (list, tuple, set)):
            self.stop = list(self.stop)
        for name in ("stop_token_ids", "eos_token_ids"):
            if isinstance(getattr(self, name), (tuple, set)):
                setattr(self, name, list(getattr(self, name)))
        for name in ("stop", "stop_token_ids", "bad_words"):
            if getattr(self, name) is None:
                setattr(self, name, [])  # vLLM's spelling of "none"
        if self.seed == -1 and _is_int(self.seed):
            self.seed = None  # vLLM's spelling of "unseeded"
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is True:
                setattr(self, name, 1)  # as vLLM: the sampled token's and the best one's
        if self.logit_bias is not None:
            self.logit_bias = self._normalize_logit_bias(self.logit_bias)
        if isinstance(self.allowed_token_ids, (list, tuple, set)):
            self.allowed_token_ids = list(self.allowed_token_ids)
        if isinstance(self.bad_words, (list, tuple)) and all(isinstance(w, str) for w in self.bad_words):
            # Duplicates would only be checked twice per step.
            self.bad_words = list(dict.fromkeys(self.bad_words))
        if self.thinking_token_budget == -1 and _is_int(self.thinking_token_budget):
            self.thinking_token_budget = None  # vLLM's spelling of "no limit"
        self.validate()

    @staticmethod
    def _normalize_logit_bias(bias: Any) -> dict[int, float]:
        if not isinstance(bias, dict):
            raise _bad("logit_bias", bias, "a dict of token id -> bias")
        out: dict[int, float] = {}
        for tok, value in bias.items():
            try:
                # JSON object keys are strings; accept "42" as token 42.
                tok_id = int(tok)
            except (TypeError, ValueError):
                raise _bad("logit_bias", bias, f"integer token ids as keys, got key {tok!r}") from None
            out[tok_id] = float(value)
        return out

    def validate(self) -> None:
        """Check every field.

        Raises:
            ValueError: A field is out of range; the message names the field, its value
                and what was expected.
        """
        _int(self.n, "n", 1)
        _float(self.temperature, "temperature", "a number >= 0 and <= 2")
        if not 0 <= self.temperature <= 2:  # vLLM's range
            raise _bad("temperature", self.temperature, "a number >= 0 and <= 2 (0 means greedy)")
        if self.n > 1 and self.temperature < SAMPLING_EPS:
            # vLLM's rule, whatever the seed: the n greedy completions would all be the same.
            raise _bad("n", self.n, f"1 with greedy sampling (temperature={self.temperature}): its completions "
                                    "would all be the same; sample with a temperature > 0 for several")
        _float(self.top_p, "top_p", "a number in (0, 1]")
        if not 0.0 < self.top_p <= 1.0:
            raise _bad("top_p", self.top_p, "a number in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or not -1 <= self.top_k < 2**63:
            raise _bad("top_k", self.top_k, "an integer >= 1 (64-bit), or 0 / -1 to disable it")
        _float(self.min_p, "min_p", "a number in [0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise _bad("min_p", self.min_p, "a number in [0, 1]")
        if self.seed is not None:
            _int(self.seed, "seed", None)
            if not -(2**63) <= self.seed < 2**63:  # vLLM's bound too (a torch long)
                raise _bad("seed", self.seed, "a 64-bit signed integer")
        if self.max_tokens is not None:
            _int(self.max_tokens, "max_tokens", 1)
        if self.stream_interval is not None:
            _int(self.stream_interval, "stream_interval", 1)
            if self.stream_interval >= 2**63:  # (it crosses to the engine core as a msgpack int)
                raise _bad("stream_interval", self.stream_interval, "an integer >= 1 and < 2**63")
        _int(self.min_tokens, "min_tokens", 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise _bad(
                "min_tokens", self.min_tokens,
                f"a value <= max_tokens ({self.max_tokens})",
            )
        if self.min_tokens and self.structured_outputs is not None:
            # A grammar that is complete allows only EOS, which min_tokens bans: no token
            # would be left to sample.
            raise _bad("min_tokens", self.min_tokens,
                       "0 with structured_outputs: the grammar decides where a constrained output ends")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _float(value, name, "a number in [-2, 2]")
            if not -2.0 <= value <= 2.0:
                raise _bad(name, value, "a number in [-2, 2]")
        _float(self.repetition_penalty, "repetition_penalty", "a number > 0")
        if not self.repetition_penalty > 0.0:
            raise _bad("repetition_penalty", self.repetition_penalty, "a number > 0 (1 disables it)")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and value >= -1):
                raise _bad(name, value, "an integer >= 0, or -1 for the whole vocabulary")
        if self.allowed_token_ids is not None and not (
            isinstance(self.allowed_token_ids, list) and self.allowed_token_ids
            and all(_is_int(t) and t >= 0 for t in self.allowed_token_ids)
        ):
            raise _bad("allowed_token_ids", self.allowed_token_ids, "a non-empty list of token ids >= 0")
        if self.bad_words is not None:
            if not isinstance(self.bad_words, list) or not all(
                isinstance(w, str) and w.strip() for w in self.bad_words
            ):
                raise _bad("bad_words", self.bad_words, "a list of strings that are not empty or only whitespace")
            for word in self.bad_words:
                try:
                    word.encode("utf-8")
                except UnicodeEncodeError:
                    # A lone surrogate (JSON allows one) would fail tokenization in the worker.
                    raise _bad("bad_words", self.bad_words, "valid Unicode strings") from None
            if len(self.bad_words) > MAX_BAD_WORDS:
                raise _bad("bad_words", f"<{len(self.bad_words)} words>", f"at most {MAX_BAD_WORDS} words")
        if self.bad_words_token_ids is not None and not all(
            isinstance(seq, list) and seq and all(_is_int(t) and t >= 0 for t in seq)
            for seq in self.bad_words_token_ids
        ):
            raise _bad("bad_words_token_ids", self.bad_words_token_ids, "non-empty lists of token ids >= 0")
        if self.thinking_token_budget is not None and not (
                _is_int(self.thinking_token_budget) and self.thinking_token_budget >= 0):
            raise _bad("thinking_token_budget", self.thinking_token_budget, "an integer >= 0, or -1 for no limit")
        for name in ("reasoning_start_token_ids", "reasoning_end_token_ids"):
            ids = getattr(self, name)
            if ids is not None and not (isinstance(ids, list) and ids and all(_is_int(t) and t >= 0 for t in ids)):
                raise _bad(name, ids, "a non-empty list of token ids >= 0")
        for name in ("stop_token_ids", "eos_token_ids"):
            ids = getattr(self, name)
            if ids is not None and not (isinstance(ids, list) and all(_is_int(t) and t >= 0 for t in ids)):
                raise _bad(name, ids, "a list of token ids >= 0")
        if self.stop is not None and not (isinstance(self.stop, list) and all(isinstance(s, str) and s
                                                                               for s in self.stop)):
            raise _bad("stop", self.stop, "a non-empty string or a list of non-empty strings")
        for name in ("detokenize", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, getattr(self, name), "a bool (True or False)")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise _bad("output_kind", self.output_kind, "a RequestOutputKind (CUMULATIVE, DELTA or FINAL_ONLY)")
        if self.stop and not self.detokenize:
            # Stop strings are matched against the text, which detokenize=False never makes.
            raise _bad("stop", self.stop, "no stop strings when detokenize=False (they match text)")
        if self.logit_bias is not None:
            for tok, value in self.logit_bias.items():
                if tok < 0 or math.isnan(value):
                    raise _bad("logit_bias", self.logit_bias, "token ids >= 0 mapped to numbers")
                if value == math.inf:
                    # Sampling from a distribution with an infinite logit is undefined (its
                    # softmax is NaN); -inf, a ban, is fine.
                    raise _bad("logit_bias", self.logit_bias, "finite biases or -inf (to force tokens, use "
                               "allowed_token_ids)")
        if self.extra_args is not None:
            if not isinstance(self.extra_args, dict):
                raise _bad("extra_args", self.extra_args, "a dict")
            error = _msgpack_error(self.extra_args)  # (refused here, not mid-run)
            if error is not None:
                raise _bad("extra_args", self.extra_args, "plain data that msgpack can carry (64-bit integers, "
                           f"floats, strings, booleans, None, lists, dicts): {error}")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise _bad("structured_outputs", self.structured_outputs, "a StructuredOutputsParams")

    # -- derived properties -------------------------------------------------------------
    @property
    def sampling_type(self) -> SamplingType:
        """Greedy below ``SAMPLING_EPS``; otherwise seeded or unseeded random."""
        if self.temperature < SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def all_stop_token_ids(self) -> set[int]:
        """``stop_token_ids`` plus the EOS ids: what ``min_tokens`` masks.

        EOS is included even with ``ignore_eos`` (vLLM does the same): ``min_tokens``
        promises that many tokens of real output before the model may say it is done.
        """
        return set(self.stop_token_ids or ()) | set(self.eos_token_ids or ())

    @property
    def eos_token_id(self) -> int | None:
        """The model's EOS token that ends this request (vLLM's property): the first of
        ``eos_token_ids`` (the tokenizer's, once the engine has filled them), ``None`` with
        ``ignore_eos`` or before the engine filled them."""
        if self.ignore_eos or not self.eos_token_ids:
            return None
        return self.eos_token_ids[0]

    def update_from_generation_config(
        self, generation_config: dict[str, Any], model_eos_token_id: int | None = None
    ) -> None:
        """Record the model's EOS ids (called by the engine, once per request).

        Args:
            generation_config: The model's ``generation_config.json`` as a dict; its
                ``eos_token_id`` may be an int or a list.
            model_eos_token_id: The tokenizer's EOS id.
        """
        ids: list[int] = list(self.eos_token_ids or ())
        extra = generation_config.get("eos_token_id")
        candidates = [model_eos_token_id] + (extra if isinstance(extra, list) else [extra])
        for tok in candidates:
            if tok is not None and tok not in ids:
                ids.append(int(tok))
        self.eos_token_ids = ids

    def update_from_tokenizer(self, tokenizer: Any) -> None:
        """Tokenize ``bad_words`` into ``bad_words_token_ids`` (a no-op without them).

        Each word (leading whitespace stripped) is encoded without special tokens, and
        again with one leading space when that gives other tokens: byte-level BPE
        tokenizers spell a word differently at the start of a text and after a space,
        and both spellings are banned. (vLLM adds the spaced spelling only when it has
        as many tokens as the plain one; banning it always is stricter.)

        Args:
            tokenizer: A Hugging Face tokenizer of the model.
        """
        if not self.bad_words:
            return
        sequences: list[list[int]] = []
        for word in self.bad_words:
            for text in (word.lstrip(), " " + word.lstrip()):
                ids = [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
                if ids and ids not in sequences:
                    sequences.append(ids)
        self.bad_words_token_ids = sequences

    def clone(self) -> "SamplingParams":
        """A deep copy: mutating the clone's lists or ``extra_args`` leaves this intact."""
        return copy.deepcopy(self)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass
class BeamSearchParams:
    """What :meth:`forkless.LLM.beam_search` searches with (vLLM's names).

    Attributes:
        beam_width: Beams kept per step, and sequences returned per prompt.
        max_tokens: Most tokens generated per beam.
        ignore_eos: Keep beams going past EOS.
        temperature: Sampling temperature of the token each step samples besides the top
            ``2 * beam_width`` (0: greedy, adding nothing).
        length_penalty: Scores divide the cumulative logprob by ``length ** length_penalty``.
        include_stop_str_in_output: Keep the EOS token's text in ``text``.
        structured_outputs: Only ``None`` (vLLM's field): forkless's beam search cannot
            constrain its beams, since each step is a fresh one-token request whose grammar
            would start over; a constraint is refused rather than ignored.
        skip_special_tokens: Leave special tokens' text out of ``text``.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None  # (vLLM's position)
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        owner = "BeamSearchParams"
        if self.structured_outputs is not None:
            raise _bad("structured_outputs", self.structured_outputs, "None: beam search cannot constrain its "
                       "outputs (each step is a new one-token request, whose grammar would start over)", owner)
        _int(self.beam_width, "beam_width", 1, owner)
        _int(self.max_tokens, "max_tokens", 1, owner)
        _float(self.temperature, "temperature", "a number >= 0", owner)
        if self.temperature < 0:
            raise _bad("temperature", self.temperature, "a number >= 0", owner)
        _float(self.length_penalty, "length_penalty", "a number", owner)


def logprobs_cap(max_logprobs: int, vocab_size: int) -> int:
    """The most logprobs a token may have: ``--max-logprobs``, or the vocabulary for -1."""
    return vocab_size if max_logprobs == -1 else max_logprobs


def check_logprobs_count(field: str, asked: int | None, max_logprobs: int, vocab_size: int) -> None:
    """Refuse more logprobs per token than the engine allows.

    Args:
        field: The request's name for the count (``logprobs``, ``top_logprobs``...).
        asked: The count asked for; -1 is the whole vocabulary, ``None`` none.
        max_logprobs: ``--max-logprobs`` (-1: the whole vocabulary).
        vocab_size: The model's vocabulary size.

    Raises:
        ValueError: ``asked`` is over the limit (the message names the field and the flag).
    """
    if asked is None:
        return
    cap = logprobs_cap(max_logprobs, vocab_size)
    num = vocab_size if asked == -1 else asked
    if num > cap:
        raise ValueError(f"{field}={asked} asks for {num} logprobs per token, more than this engine allows "
                         f"({cap}: --max-logprobs, -1 for the whole vocabulary of {vocab_size})")


def _msgpack_error(value: Any) -> Exception | None:
    """Why ``value`` cannot cross to the engine core and the workers as msgpack (an
    integer beyond 64 bits, an object), or ``None`` when it can."""
    try:
        msgspec.msgpack.encode(value)
    except (TypeError, OverflowError, ValueError) as exc:
        return exc
    return None


def _int(value: Any, field: str, minimum: int | None, owner: str = "SamplingParams") -> None:
    if not _is_int(value):
        raise _bad(field, value, "an integer" if minimum is None else f"an integer >= {minimum}", owner)
    if minimum is not None and value < minimum:
        raise _bad(field, value, f"an integer >= {minimum}", owner)


def _float(value: Any, field: str, expected: str, owner: str = "SamplingParams") -> None:
    # NaN and +-inf are refused whatever the range: no sampling field can mean them, and
    # a range check alone lets inf through wherever the range is open-ended.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(field, value, expected, owner)
    if not math.isfinite(value):
        raise _bad(field, value, f"a finite number, {expected}", owner)
