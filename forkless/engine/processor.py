"""Input side of the engine: prompts -> validated ``EngineCoreRequest``s (torch-free).

Tokenizes text prompts, renders chat templates, validates prompts and sampling
parameters against the model (clear ``ValueError``s, before anything reaches the engine
core), fills in the model's EOS ids, and fans ``n > 1`` out into ``n`` child requests.
"""

from __future__ import annotations

import json
import operator
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, Union

import msgspec

from forkless.logger import init_logger
from forkless.pooling_params import PoolingParams
from forkless.protocol.engine import EngineCoreRequest
from forkless.protocol.lora import LoRARequest
from forkless.sampling_params import RequestOutputKind, SamplingParams, check_logprobs_count

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from forkless.config import EngineConfig
    from forkless.logits_processors import LogitsProcessor

logger = init_logger(__name__)

# A prompt: text, token ids, or a vLLM-style dict with "prompt" or "prompt_token_ids" (and
# optionally "cache_salt", as vLLM's TextPrompt / TokensPrompt).
PromptType = Union[str, Sequence[int], Mapping[str, Any]]


# Content parts a text-only model reads (an assistant message's "refusal" part is text too),
# and the key of each one's text.
_TEXT_PARTS = {"text": "text", "input_text": "text", "refusal": "refusal"}


# The keys of a prompt dict (vLLM's TextPrompt / TokensPrompt, text-only); token_type_ids
# only for pooling (a cross-encoder's pair).
_PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids", "cache_salt"})
_MULTIMODAL_KEYS = frozenset({"multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids"})


def _check_prompt_keys(prompt: Mapping[str, Any], pooling: bool) -> None:
    """Refuse what a prompt dict holds that forkless would otherwise ignore."""
    allowed = _PROMPT_KEYS | {"token_type_ids"} if pooling else _PROMPT_KEYS
    for key in prompt:
        if key in allowed or prompt[key] is None:
            continue
        if key in _MULTIMODAL_KEYS:
            raise ValueError(f"a prompt with {key!r}: forkless's models read text only")
        if key == "token_type_ids":
            raise ValueError("token_type_ids is for cross-encoder pooling models (LLM.score / LLM.encode), "
                             "not for generation")
        raise ValueError(f"unknown key {key!r} in a prompt dict (it takes {', '.join(sorted(allowed))})")


def _token_ids(ids: Any, name: str) -> list[int]:
    """``ids`` as a list of ints; a ValueError naming ``name`` for anything else (a string,
    floats), which ``int()`` would have turned into other tokens."""
    if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Iterable):
        raise ValueError(f"{name} must be a list of token ids, got {type(ids).__name__}")
    out = []
    for i, t in enumerate(ids):  # (a list, a tuple, a NumPy array or a tensor of ints)
        if isinstance(t, bool):
            raise ValueError(f"{name}[{i}] must be a token id (an integer), got {t!r}")
        try:
            out.append(operator.index(t))
        except TypeError:
            raise ValueError(f"{name}[{i}] must be a token id (an integer), got {t!r:.40}") from None
    return out


def template_message(message: Mapping[str, Any], where: str = "message") -> dict[str, Any]:
    """A copy of a chat message as chat templates expect it (the caller's is left as is).

    The content becomes one string (:func:`message_text`). OpenAI clients send an
    assistant turn's earlier tool calls with ``function.arguments`` as a JSON string;
    templates iterate a mapping (Hugging Face's tool-use convention), so a string that
    parses as a JSON object becomes that object, as vLLM does; any other string is left
    for the template to show as it is.
    """
    out = {**message, "content": message_text(message.get("content"), where)}
    calls = message.get("tool_calls")
    if isinstance(calls, (list, tuple)):
        out["tool_calls"] = [_parsed_arguments(call) for call in calls]
    return out


def _parsed_arguments(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        arguments = json.loads(fn["arguments"])
    except ValueError:
        return call
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**fn, "arguments": arguments}}


def message_text(content: Any, where: str = "message") -> str:
    """A chat message's ``content`` as the one string chat templates expect.

    ``None`` (an assistant turn that only calls tools, as the OpenAI SDK sends it) is
    ``""``; a list of OpenAI content parts is its text parts joined by newlines, as vLLM
    does for templates that take string content.

    Args:
        content: The message's content.
        where: How messages name this one (``messages[2]``).

    Raises:
        ValueError: A part that is not text (forkless's models read text only) or a
            malformed one; the message names it by index.
    """
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, (list, tuple)):
        raise ValueError(f"{where}.content must be a string, a list of content parts or null, "
                         f"got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if key is None:
            if not isinstance(kind, str):
                raise ValueError(f'{where}.content[{j}] is not a content part: expected an object with a "type" '
                                 '("text")')
            raise ValueError(f"{where}.content[{j}] has type {kind!r}, which forkless does not support: its "
                             'models read text only ("text" parts)')
        text = part.get(key)
        if not isinstance(text, str):
            raise ValueError(f"{where}.content[{j}] (a {kind!r} part) needs a string {key!r}")
        texts.append(text)
    return "\n".join(texts)


@dataclass
class ProcessedRequest:
    """One user request, ready for the output processor and the engine core.

    Attributes:
        request_id: The user-visible id.
        prompt: The prompt text, when there was one.
        prompt_token_ids: The tokenized prompt.
        params: The request's parameters as given (``n`` may be > 1).
        arrival_time: ``time.time()`` at arrival.
        core_requests: What to send to the engine core: one request (same id) for
            ``n == 1``, else ``n`` children with ids ``"{i}_{request_id}"``.
        pooling_params: Set for a pooling request (its output is a
            ``PoolingRequestOutput``).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    core_requests: list[EngineCoreRequest]
    pooling_params: PoolingParams | None = None


# vLLM's refusal of a request with a thinking_token_budget by an engine without reasoning
# markers (its InputProcessor's words).
THINKING_BUDGET_WITHOUT_REASONING = (
    "thinking_token_budget is set but reasoning_config is not configured. Please set --reasoning-parser "
    "and/or --reasoning-config to use thinking_token_budget.")


class NoChatTemplateError(ValueError):
    """The model has no chat template and the caller gave none."""


def child_request_id(index: int, request_id: str) -> str:
    """The engine-core id of completion ``index`` of a request with ``n > 1``."""
    return f"{index}_{request_id}"


class Processor:
    """Validates and tokenizes requests for one engine.

    Args:
        config: The engine configuration.
        tokenizer: A tokenizer to use instead of loading ``config.model_config.tokenizer``.
    """

    def __init__(self, config: EngineConfig, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
        self.config = config
        self._tokenizer = tokenizer
        self._custom_lp: list[type[LogitsProcessor]] | None = None
        # Adapters already checked (their folders are read once per engine): lora_int_id ->
        # (its folder, the requests checked with it, load_inplace off). The API server
        # checks from several threads: the lock guards it (never held while reading).
        self._checked_loras: dict[int, tuple[str, set[LoRARequest]]] = {}
        self._lora_lock = threading.Lock()
        # lora_int_id -> how many times load_inplace replaced its weights (prefix-cache salt).
        self._lora_versions: dict[int, int] = {}
        # Adapter ids whose next request reloads them (replace_lora_weights).
        self._lora_reload: set[int] = set()
        self._lora_shapes: dict[str, tuple[int, int]] | None = None
        self._config_json: dict[str, Any] | None = None
        # The reasoning markers' token ids (reasoning_token_ids), once resolved.
        self._reasoning_ids: tuple[list[int], list[int]] | None = None
        self._reasoning_resolved = False

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer (loaded on first use, as ``AutoTokenizer`` loads it)."""
        if self._tokenizer is None:
            started = time.perf_counter()
            from forkless.tokenizers.loading import load_tokenizer

            path = self.config.model_config.tokenizer
            self._tokenizer = load_tokenizer(path)
            # Importing transformers makes this one of the slow steps of a start.
            logger.info("loaded the tokenizer in %.1f s: %s", time.perf_counter() - started, path)
        return self._tokenizer

    @property
    def reasoning_token_ids(self) -> tuple[list[int], list[int]] | None:
        """The reasoning's start and end markers as token ids (``--reasoning-config``, else
        ``--reasoning-parser``'s markers), which ``thinking_token_budget`` counts from and
        forces; ``None`` when the engine has none. Resolved once, with the tokenizer (the
        API server asks at start, so that a bad marker fails the start).

        Raises:
            ValueError: A marker string encodes to no token.
        """
        if not self._reasoning_resolved:
            rc = self.config.reasoning_config
            ids = None
            if rc is not None:
                so = self.config.structured_outputs_config
                ids = rc.token_ids(self.tokenizer, so.reasoning_parser_plugin if so is not None else "")
                if ids is None:  # vLLM's warning: its requests with a budget are refused too
                    logger.warning("the reasoning markers are unknown: the %r reasoning parser names no "
                                   "reasoning_start_str / reasoning_end_str, so requests with a "
                                   "thinking_token_budget are refused (give them with --reasoning-config)",
                                   rc.reasoning_parser)
            self._reasoning_ids, self._reasoning_resolved = ids, True
        return self._reasoning_ids

    # --------------------------------------------------------------------- prompts

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        content_format: str = "auto",
    ) -> dict[str, Any]:
        """Render a conversation with the tokenizer's chat template.

        Args:
            messages: OpenAI-style ``{"role": ..., "content": ...}`` messages.
            chat_template: A Jinja template overriding the tokenizer's.
            add_generation_prompt: End with the assistant turn's header.
            continue_final_message: Leave the last message open for the model to continue.
            tools: Tool schemas passed to the template.
            documents: Retrieval documents (``{"title": ..., "text": ...}``) for RAG templates.
            chat_template_kwargs: Extra template variables (e.g. ``enable_thinking``).
            content_format: ``"string"`` or ``"auto"`` (each content one string) or
                ``"openai"`` (each content a list of text parts), vLLM's
                ``chat_template_content_format``.

        Returns:
            A prompt dict with ``prompt`` (the text) and ``prompt_token_ids``.

        Each message is prepared first (:func:`template_message`): its content becomes one
        string (``None`` is ``""``, a list of content parts its text parts joined by
        newlines), and earlier tool calls' JSON-string ``arguments`` become mappings.

        Raises:
            NoChatTemplateError: The tokenizer has no chat template and none was given.
            ValueError: A content part is not text, or the template failed to render these
                messages (the message says which and why).
        """
        from jinja2 import TemplateError

        if content_format not in ("auto", "string", "openai"):
            raise ValueError(f"chat_template_content_format must be 'auto', 'string' or 'openai', "
                             f"got {content_format!r}")
        messages = [template_message(m, f"messages[{i}]") if isinstance(m, Mapping) else m
                    for i, m in enumerate(messages)]
        if content_format == "openai":
            # Templates that iterate content parts get the text as one part.
            messages = [{**m, "content": [{"type": "text", "text": m["content"]}] if m["content"] else []}
                        if isinstance(m, Mapping) else m for m in messages]
        tokenizer = self.tokenizer
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise NoChatTemplateError(
                f"the tokenizer in {self.config.model_config.tokenizer} has no chat template; pass "
                "chat_template=... or use generate() with a plain prompt"
            )
        # The request's own template variables win over the arguments (vLLM's order), so
        # that chat_template_kwargs may set add_generation_prompt, tools or documents too.
        variables: dict[str, Any] = dict(chat_template=chat_template, tools=tools, documents=documents,
                                         add_generation_prompt=add_generation_prompt and not continue_final_message,
                                         continue_final_message=continue_final_message)
        variables.update(chat_template_kwargs or {})
        variables.pop("tokenize", None)  # the text is tokenized below, with the template's special tokens
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, **variables)
        except (TemplateError, TypeError) as exc:
            # Templates reject conversations with raise_exception(...), or trip over a value
            # they did not expect (content None in an assistant turn); the user must see why.
            raise ValueError(f"the chat template failed to render the messages: {exc}") from exc
        # The template already wrote the special tokens (BOS...) as text.
        ids = tokenizer.encode(text, add_special_tokens=False)
        return {"prompt": text, "prompt_token_ids": ids}

    @property
    def eos_token_id(self) -> int | None:
        """The token that ends a generation: the model's (``generation_config.json``), else the
        tokenizer's."""
        mc = self.config.model_config
        return mc.eos_token_id if mc.eos_token_id is not None else self.tokenizer.eos_token_id

    def prompt_token_ids(self, prompt: PromptType) -> list[int]:
        """A generation prompt's token ids (text is tokenized as :meth:`process_inputs` does).

        Raises:
            ValueError: Not a prompt (the message says what forms are).
        """
        return self._tokenize(prompt)[1]

    def _tokenize(self, prompt: PromptType, pooling: bool = False) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer.encode(prompt))
        if isinstance(prompt, Mapping):
            _check_prompt_keys(prompt, pooling)
            if prompt.get("prompt_token_ids") is not None:
                return prompt.get("prompt"), _token_ids(prompt["prompt_token_ids"], "prompt_token_ids")
            if isinstance(prompt.get("prompt"), str):
                return prompt["prompt"], list(self.tokenizer.encode(prompt["prompt"]))
            raise ValueError(f"a prompt dict needs 'prompt' (text) or 'prompt_token_ids', got keys {sorted(prompt)}")
        if isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise ValueError(f"a prompt must be a string, a list of token ids, or a dict; got {type(prompt).__name__}")

    @staticmethod
    def _cache_salt(prompt: PromptType) -> str | None:
        """A prompt dict's ``cache_salt`` (vLLM's rule: a non-empty string, or absent/None)."""
        if not isinstance(prompt, Mapping):
            return None
        salt = prompt.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise ValueError(f"cache_salt must be a non-empty string if given, got {salt!r:.50}")
        return salt

    # ------------------------------------------------------------------ validation

    def _validate_prompt(self, ids: list[int]) -> None:
        mc = self.config.model_config
        if not ids:
            raise ValueError("the prompt is empty: it must contain at least one token")
        if len(ids) >= mc.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens, but max_model_len (--max-model-len) is "
                f"{mc.max_model_len}: prompt + output must fit in it, so the prompt must be "
                f"shorter than {mc.max_model_len} tokens"
            )
        bad = [t for t in ids if not 0 <= t < mc.vocab_size]
        if bad:
            raise ValueError(f"the prompt has token ids {bad[:5]} outside the vocabulary [0, {mc.vocab_size})")

    def _validate_params(self, params: Any, priority: int) -> SamplingParams:
        from forkless.logits_processors import load_custom_classes, validate_request_params

        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        params.validate()
        if self._custom_lp is None:
            self._custom_lp = load_custom_classes(self.config.logits_processors)
        validate_request_params(params, self._custom_lp, self.config.model_config.vocab_size)
        mc = self.config.model_config
        for name in ("logprobs", "prompt_logprobs"):
            check_logprobs_count(name, getattr(params, name), mc.max_logprobs, mc.vocab_size)
        if params.thinking_token_budget is not None and self.reasoning_token_ids is None:
            raise ValueError(THINKING_BUDGET_WITHOUT_REASONING)
        transfer = (params.extra_args or {}).get("kv_transfer_params")
        if transfer is not None:
            # vLLM logs and drops them without a connector; nothing would read them here.
            if self.config.kv_transfer_config is None:
                raise ValueError("kv_transfer_params are for a KV connector, and this engine has none: start it "
                                 "with --kv-transfer-config")
            if not isinstance(transfer, dict):
                raise ValueError(f"kv_transfer_params must be an object (a dict), got {type(transfer).__name__}")
        if priority != 0 and self.config.scheduler_config.policy != "priority":
            raise ValueError(
                f"priority={priority} was given but the scheduling policy is "
                f"{self.config.scheduler_config.policy!r}: start the engine with "
                "--scheduling-policy priority"
            )
        return params

    def check_structured_outputs(self, params: SamplingParams) -> None:
        """Check a request's constraint ahead of :meth:`process_inputs`, which checks it
        again: the API server calls this off its event loop, since checking a large
        constraint takes a second or more (50,000 choices), and the answer is remembered
        (``choose_backend``), so the check on the loop is then a lookup.

        Raises:
            ValueError: The constraint is invalid or no backend supports it.
        """
        if params.structured_outputs is not None:
            self._structured_output_backend(params)

    def _structured_output_backend(self, params: SamplingParams) -> str:
        """The backend that compiles the request's constraint (see ``choose_backend``).

        Raises:
            ValueError: The constraint is invalid or no backend supports it; the message
                names the problem.
        """
        from forkless.structured_output import StructuredOutputsConfig, choose_backend

        assert params.structured_outputs is not None
        config = self.config.structured_outputs_config or StructuredOutputsConfig()
        try:
            return choose_backend(params.structured_outputs, config)
        except ValueError as exc:
            raise ValueError(f"structured_outputs: {exc}") from None

    def check_lora(self, lora: Any) -> LoRARequest:
        """Check that an adapter can be served: LoRA on, folder readable, shapes fit the model.

        Torch-free (the adapter's config and safetensors header only); the worker reads
        the tensors when a request first uses it.

        Args:
            lora: A :class:`LoRARequest`.

        Returns:
            The same request.

        Raises:
            ValueError: LoRA is off, ``lora`` is not a ``LoRARequest``, its id is another
                adapter folder's, or the adapter is malformed
                (``forkless.lora.peft.LoRAAdapterError``, naming the adapter).
        """
        if not isinstance(lora, LoRARequest):
            raise ValueError(f"lora_request must be a forkless.lora.LoRARequest, got {type(lora).__name__}")
        lc = self.config.lora_config
        if lc is None:
            raise ValueError(f"LoRA adapter {lora.lora_name!r} was requested but LoRA is off: start the engine "
                             "with --enable-lora (LLM(..., enable_lora=True))")
        with self._lora_lock:
            checked = self._checked_loras.get(lora.lora_int_id)
            if checked is not None and lora in checked[1]:
                return lora
            self._refuse_other_folder(lora)
        from forkless.lora import peft

        peft.read_adapter(lora, max_rank=lc.max_lora_rank, module_shapes=self._model_lora_shapes())
        plain = msgspec.structs.replace(lora, load_inplace=False)
        with self._lora_lock:
            self._refuse_other_folder(lora)  # (a concurrent check may have taken the id meanwhile)
            checked = self._checked_loras.get(lora.lora_int_id)
            if lora.load_inplace or checked is None:  # load_inplace: the id's folder is this one from now on
                self._checked_loras[lora.lora_int_id] = (lora.lora_path, {plain})
            else:
                checked[1].add(plain)
        return lora

    def _refuse_other_folder(self, lora: LoRARequest) -> None:
        # The workers cache adapters by id: one id with two folders would silently run the
        # first folder's weights for both. (Under _lora_lock.)
        checked = self._checked_loras.get(lora.lora_int_id)
        if lora.load_inplace or checked is None or checked[0] == lora.lora_path:
            return
        other = next(iter(checked[1]))
        raise ValueError(f"LoRA adapter {lora.lora_name!r} ({lora.lora_path}) has lora_int_id "
                         f"{lora.lora_int_id}, which adapter {other.lora_name!r} ({other.lora_path}) already "
                         "has: give each adapter its own lora_int_id")

    def forget_lora(self, lora_int_id: int) -> None:
        """Forget an adapter id's check (the server unloaded it and never uses the id
        again), so that the checks kept do not grow with every adapter ever loaded. A
        request for it still in flight checks its folder again; its weights' version (for
        the prefix cache) is kept."""
        with self._lora_lock:
            self._checked_loras.pop(lora_int_id, None)

    def replace_lora_weights(self, lora: LoRARequest) -> None:
        """Make the next request with this adapter's id reload it in the workers (as a
        ``load_inplace`` request does): ``/v1/load_lora_adapter`` with ``load_inplace``.

        Raises:
            ValueError: The adapter cannot be served (see :meth:`check_lora`).
        """
        self.check_lora(msgspec.structs.replace(lora, load_inplace=True))
        self._lora_reload.add(lora.lora_int_id)

    def _lora_cache_salt(self, lora: LoRARequest, cache_salt: str | None) -> str | None:
        """The request's cache salt, with the version of its adapter's weights once a
        ``load_inplace`` request replaced them: the prefix cache's blocks of the earlier
        weights (same adapter name, same prompt) are then never read again."""
        if lora.load_inplace:
            self._lora_versions[lora.lora_int_id] = self._lora_versions.get(lora.lora_int_id, 0) + 1
        version = self._lora_versions.get(lora.lora_int_id)
        if not version:
            return cache_salt
        return f"{cache_salt or ''}\x00lora {lora.lora_int_id} weights {version}"

    def _model_lora_shapes(self) -> dict[str, tuple[int, int]] | None:
        """The built-in architectures' adaptable projections (others are checked in the worker)."""
        from forkless.lora.peft import LLAMA_FAMILY, llama_lora_shapes

        mc = self.config.model_config
        if mc.architecture not in LLAMA_FAMILY:
            return None
        if self._lora_shapes is None:
            import json
            from pathlib import Path

            hf = json.loads((Path(mc.model) / "config.json").read_text())
            self._lora_shapes = llama_lora_shapes(hf.get("text_config") or hf)
        return self._lora_shapes

    # --------------------------------------------------------------------- requests

    def process_inputs(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | None = None,
        *,
        arrival_time: float | None = None,
        priority: int = 0,
        group_id: str | None = None,
        lora_request: LoRARequest | None = None,
        client_key: str | None = None,
    ) -> ProcessedRequest:
        """Tokenize and validate one request.

        Args:
            request_id: Unique id of the request.
            prompt: Text, token ids, or ``{"prompt": ...}`` / ``{"prompt_token_ids": ...}``;
                a dict may add ``"cache_salt"``: the request then shares prefix-cache blocks
                only with requests of the same salt (as vLLM).
            params: Sampling parameters (default ``SamplingParams()``); not modified.
            arrival_time: Default ``time.time()``.
            priority: Lower runs first under ``--scheduling-policy priority``.
            group_id: The larger request this one is part of (the API server's id of a
                request with several prompts), which the scheduler's per-request limits
                count as one. Default: ``request_id`` (its ``n`` children share it).
            lora_request: The LoRA adapter to generate with (``None``: the base model).
            client_key: Who sent it (the API server's), for the scheduler's per-client
                share of a step's prefill. ``None``: no client (offline).

        Returns:
            The processed request.

        Raises:
            ValueError: A request id that is not a non-empty string, an empty prompt, a
                prompt not shorter than ``max_model_len``, token ids
                outside the vocabulary, invalid sampling parameters, a priority without the
                priority policy, a ``cache_salt`` that is not a non-empty string, or a
                LoRA adapter that cannot be served (see :meth:`check_lora`).
        """
        if self.config.model_config.pooler_config is not None:
            raise ValueError(f"{self.config.model_config.served_model_name} is a pooling model (--runner pooling): "
                             "it makes embeddings, classifications and scores, not text (use embed / classify / "
                             "score, or /v1/embeddings, /classify, /score, /pooling)")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id={request_id!r:.80} is invalid: expected a non-empty string (vLLM's type)")
        params = self._validate_params(params if params is not None else SamplingParams(), priority)
        cache_salt = self._cache_salt(prompt)
        if lora_request is not None:
            self.check_lora(lora_request)
        text, ids = self._tokenize(prompt)
        self._validate_prompt(ids)
        arrival_time = time.time() if arrival_time is None else arrival_time
        mc = self.config.model_config
        tokenizer_eos = self.tokenizer.eos_token_id
        eos = self.eos_token_id
        core_params = params.clone()
        # -1 asks for the whole vocabulary: the worker takes the count.
        if core_params.logprobs == -1:
            core_params.logprobs = mc.vocab_size
        if core_params.prompt_logprobs == -1:
            core_params.prompt_logprobs = mc.vocab_size
        if core_params.structured_outputs is not None:
            # Checked here (torch-free), so that a bad schema, regex or grammar is refused
            # before it reaches the engine core; the engine core compiles with this backend.
            core_params.structured_outputs._backend = self._structured_output_backend(core_params)
        core_params.update_from_generation_config(mc.generation_config, tokenizer_eos)
        # bad_words become token ids here, where the tokenizer already is: the workers
        # never load one.
        core_params.update_from_tokenizer(self.tokenizer)
        if core_params.thinking_token_budget is not None:
            # So do the reasoning markers, which the workers' budget processor matches.
            markers = self.reasoning_token_ids
            assert markers is not None  # _validate_params refused the request otherwise
            core_params.reasoning_start_token_ids = list(markers[0])
            core_params.reasoning_end_token_ids = list(markers[1])
        if lora_request is not None:  # (only once the request is valid: a refused one reloads nothing)
            if lora_request.lora_int_id in self._lora_reload:  # replace_lora_weights' next request
                self._lora_reload.discard(lora_request.lora_int_id)
                lora_request = msgspec.structs.replace(lora_request, load_inplace=True)
            cache_salt = self._lora_cache_salt(lora_request, cache_salt)
        if params.n == 1:
            children = [(request_id, core_params)]
        else:
            children = []
            for i in range(params.n):
                child = core_params.clone()
                child.n = 1
                if child.seed is not None:
                    child.seed += i
                children.append((child_request_id(i, request_id), child))
        core_requests = [
            EngineCoreRequest(
                request_id=rid,
                prompt_token_ids=ids,
                sampling_params=p,
                eos_token_id=eos,
                arrival_time=arrival_time,
                priority=priority,
                cache_salt=cache_salt,
                group_id=request_id if group_id is None else group_id,
                lora_request=lora_request,
                client_key=client_key,
            )
            for rid, p in children
        ]
        return ProcessedRequest(request_id, text, ids, params, arrival_time, core_requests)

    # ---------------------------------------------------------------------- pooling

    def tokenize_pair(self, text: str, text_pair: str, max_length: int | None = None) -> dict[str, Any]:
        """A cross-encoder's input: ``text`` and ``text_pair`` as one prompt, with segment ids.

        Args:
            text: The first text (a query).
            text_pair: The second (a document).
            max_length: Truncate the pair to this many tokens, the longer text first
                (``truncate_prompt_tokens``, as vLLM); ``None``: keep it whole.

        Returns:
            A prompt dict with ``prompt_token_ids`` and ``token_type_ids``.
        """
        truncation = {} if max_length is None else {"truncation": True, "max_length": max_length}
        enc = self.tokenizer(text, text_pair, return_token_type_ids=True, **truncation)
        types = enc.get("token_type_ids") or [0] * len(enc["input_ids"])
        return {"prompt_token_ids": list(enc["input_ids"]), "token_type_ids": list(types)}

    def process_pooling_inputs(
        self,
        request_id: str,
        prompt: PromptType,
        pooling_params: PoolingParams | None = None,
        *,
        arrival_time: float | None = None,
        priority: int = 0,
        group_id: str | None = None,
        client_key: str | None = None,
    ) -> ProcessedRequest:
        """Tokenize and validate one pooling request (embedding, classification, score).

        Args:
            request_id: Unique id of the request.
            prompt: Text, token ids, or a dict with ``prompt`` / ``prompt_token_ids`` (and
                ``token_type_ids`` for a cross-encoder pair, see :meth:`tokenize_pair`).
            pooling_params: How to pool (default: the model's task and settings).
            arrival_time: Default ``time.time()``.
            priority: Lower runs first under ``--scheduling-policy priority``.
            group_id: The larger request this one is part of.
            client_key: Who sent it.

        Returns:
            The processed request (one engine-core request, which finishes after its prompt).

        Raises:
            ValueError: The model is not a pooling model, the task is not one it serves,
                the prompt is empty, longer than ``max_model_len`` or has ids outside the
                vocabulary, ``dimensions`` the model does not allow, or a priority without
                the priority policy.
        """
        mc = self.config.model_config
        pooler = mc.pooler_config
        if pooler is None:
            raise ValueError(f"{mc.served_model_name} is a generative model: it has no embeddings or classifier "
                             "(serve a pooling model, or this one with --runner pooling --convert embed)")
        params = PoolingParams() if pooling_params is None else pooling_params.clone()
        if not isinstance(params, PoolingParams):
            raise ValueError(f"pooling_params must be a PoolingParams, got {type(params).__name__}")
        if params.task is None:
            params.task = pooler.task
        if params.task not in pooler.tasks:
            raise ValueError(f"this model does not serve the {params.task!r} task (it serves: "
                             f"{', '.join(pooler.tasks)})")
        if params.dimensions is not None:
            if pooler.matryoshka_dimensions is None:
                raise ValueError(f"dimensions={params.dimensions}: the model does not support Matryoshka "
                                 "representation, so its embeddings cannot be shortened")
            allowed = pooler.matryoshka_dimensions
            hidden = int(self._model_json().get("hidden_size") or 0)
            if (allowed and params.dimensions not in allowed) or params.dimensions > hidden:
                raise ValueError(f"dimensions={params.dimensions} is not one the model allows "
                                 f"({allowed or f'1..{hidden}'})")
        if priority != 0 and self.config.scheduler_config.policy != "priority":
            raise ValueError(f"priority={priority} was given but the scheduling policy is "
                             f"{self.config.scheduler_config.policy!r}: start the engine with "
                             "--scheduling-policy priority")
        text, ids = self._tokenize(prompt, pooling=True)
        if isinstance(prompt, Mapping) and prompt.get("token_type_ids") is not None:
            params.token_type_ids = [int(t) for t in prompt["token_type_ids"]]
        if params.token_type_ids is not None:
            # Checked here: a wrong length or type would fail the worker's step.
            types = params.token_type_ids
            num_types = int(self._model_json().get("type_vocab_size") or 1)
            if len(types) != len(ids) or any(not 0 <= t < num_types for t in types):
                raise ValueError(f"token_type_ids must hold one type in [0, {num_types}) per prompt token "
                                 f"({len(ids)}), got {len(types)} entries")
        if not ids:
            raise ValueError("the input is empty: it must contain at least one token")
        if len(ids) > mc.max_model_len:
            raise ValueError(f"the input has {len(ids)} tokens, but this model's maximum context length "
                             f"(--max-model-len) is {mc.max_model_len} tokens")
        bad = [t for t in ids if not 0 <= t < mc.vocab_size]
        if bad:
            raise ValueError(f"the input has token ids {bad[:5]} outside the vocabulary [0, {mc.vocab_size})")
        arrival_time = time.time() if arrival_time is None else arrival_time
        # A pooling request samples nothing; these parameters only satisfy the engine's shape.
        sampling = SamplingParams(max_tokens=1, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
        core = EngineCoreRequest(
            request_id=request_id, prompt_token_ids=ids, sampling_params=sampling, eos_token_id=None,
            arrival_time=arrival_time, priority=priority,
            group_id=request_id if group_id is None else group_id, client_key=client_key,
            pooling_params=params)
        return ProcessedRequest(request_id, text, ids, sampling, arrival_time, [core], pooling_params=params)

    def _model_json(self) -> dict[str, Any]:
        """The model's ``config.json`` (read once)."""
        if self._config_json is None:
            import json
            from pathlib import Path

            self._config_json = json.loads((Path(self.config.model_config.model) / "config.json").read_text())
        return self._config_json
