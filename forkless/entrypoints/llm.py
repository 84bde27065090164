"""The offline API: ``LLM(model).generate(prompts, params)`` and ``LLM.chat(messages, params)``;
for pooling models ``LLM.embed``, ``LLM.classify``, ``LLM.reward``, ``LLM.score`` and ``LLM.encode``."""

from __future__ import annotations

import collections.abc
import contextlib
import itertools

import msgspec
import numpy as np
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, TypeVar

from forkless.beam_search import BeamSearchOutput
from forkless.config import EngineArgs
from forkless.engine.llm_engine import LLMEngine
from forkless.gc_tuning import paused_full_collections
from forkless.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from forkless.pooling.order import longest_first
from forkless.pooling_params import PoolingParams
from forkless.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from forkless.config import ModelConfig
    from forkless.engine.processor import PromptType
    from forkless.outputs import RequestOutput
    from forkless.protocol.lora import LoRARequest

_R = TypeVar("_R")
Conversation = list[dict[str, Any]]
# ``use_tqdm``: show tqdm's bar or not, or (vLLM's) a callable that makes the bar.
ProgressBar = bool | Callable[..., Any]


class LLM:
    """An engine in this process, for batch generation.

    Args:
        model: A Hugging Face model folder, a ``.gguf`` file, or ``None`` for the
            embedded default model (SmolLM2-135M-Instruct).
        **engine_args: Any :class:`forkless.config.EngineArgs` field, named like vLLM's
            flags (``max_model_len=...``, ``enable_prefix_caching=...``).
            ``disable_log_stats`` defaults to ``True`` here, as in vLLM's ``LLM``:
            ``disable_log_stats=False`` gives every ``RequestOutput`` its ``metrics``.

    Raises:
        ValueError: An invalid engine argument (the message names it).
        TypeError: An unknown engine argument.
    """

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        # vLLM's LLM collects no statistics unless asked (RequestOutput.metrics is None).
        engine_args.setdefault("disable_log_stats", True)
        try:
            args = EngineArgs(model=model, **engine_args)
        except TypeError as exc:
            import dataclasses

            known = sorted(f.name for f in dataclasses.fields(EngineArgs))
            raise TypeError(f"{exc}; known engine arguments: {', '.join(known)}") from None
        self.llm_engine = LLMEngine.from_engine_args(args)
        self._counter = itertools.count()
        # profiler_config (checked with the other arguments): start_profile's directory and flags.
        self._profiler = args.profiler_options()

    @property
    def model_config(self) -> ModelConfig:
        """The model's configuration (``max_model_len``...), as vLLM's ``LLM.model_config``."""
        return self.llm_engine.model_config

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer."""
        return self.llm_engine.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        """What :meth:`generate` and :meth:`chat` sample with when given no parameters:
        ``SamplingParams()`` with the model's generation-config defaults
        (``generation_config=`` / ``override_generation_config=``, as the server's flags)."""
        return SamplingParams(**self.llm_engine.config.model_config.sampling_defaults)

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        """Forget every cached prefix, as vLLM's ``LLM.reset_prefix_cache`` (after the
        weights changed, say): later prompts compute their KV again.

        Args:
            reset_running_requests: Preempt the requests still running first (those added
                through ``llm_engine``; :meth:`generate` returns with none), so that their
                KV is computed again too. Otherwise their blocks stay theirs, no longer
                shared with anything.
            reset_connector: Also empty the KV connector's store
                (``--kv-transfer-config``): the connector's ``reset_cache()``, once the
                workers' saves in flight have ended. The built-ins delete this model's
                blocks (``SharedStorageConnector`` its files, ``RedisConnector`` its
                ``forkless:kv:<namespace>-*`` keys), so later prompts compute their KV
                again rather than load it. Without a connector: a warning, and False.

        Returns:
            Whether everything asked for was reset: False when the connector's
            ``reset_cache()`` returned False, or ``reset_connector`` was given without a
            connector (one without the hook, whose ``reset_cache()`` returns ``None``,
            counts as reset, as in vLLM).

        Raises:
            ValueError: A flag that is not a bool.
            RuntimeError: ``reset_running_requests=True`` while a step is in flight.
        """
        return self.llm_engine.engine_core.reset_prefix_cache(reset_running_requests, reset_connector)

    def collective_rpc(self, method: str | Callable[..., Any], timeout: float | None = None,
                       args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
        """Run a method on every worker, as vLLM's ``LLM.collective_rpc``.

        Args:
            method: The name of a public method of the worker class (``worker_cls=``, a
                subclass of :class:`forkless.worker.worker.Worker`, with the methods of
                ``worker_extension_cls=`` if given), or, with the default
                ``uni`` executor (the worker in this process), a callable taking the worker
                first. Worker processes (``mp``, ``ray``) take names only: nothing is
                pickled across processes.
            timeout: Seconds to wait for every worker (``mp`` and ``ray`` executors);
                ``None``: no limit.
            args: Positional arguments (plain data across processes).
            kwargs: Keyword arguments (plain data across processes).

        Returns:
            One result per worker, by rank (decoded from msgpack across processes).

        Raises:
            AttributeError: The worker has no public method of that name.
            TypeError: A callable or non-plain data for worker processes.
            ValueError: A ``timeout`` with the ``uni`` executor, or one not > 0.
            TimeoutError: A worker did not answer within ``timeout``.
            RuntimeError: The method raised in a worker process (its traceback).
        """
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)

    def apply_model(self, func: Callable[[torch.nn.Module], _R]) -> list[_R]:
        """``func(model)`` in every worker, as vLLM's ``LLM.apply_model``: the results, by
        rank. Runs with the default ``uni`` executor only (the model in this process).

        Raises:
            TypeError: ``func`` is not callable, or the workers run in other processes
                (``mp``, ``ray``), where a function cannot go: forkless sends no pickled
                code (define a worker method, ``worker_extension_cls=``, and call it with
                :meth:`collective_rpc`).
            RuntimeError: No model is loaded (a level-2 :meth:`sleep`).
        """
        if not callable(func):
            raise TypeError(f"apply_model(func): func must be callable (it gets the model), got "
                            f"{type(func).__name__}")
        executor = self.llm_engine.engine_core.executor
        if not executor.workers_in_process:
            backend = self.llm_engine.config.parallel_config.distributed_executor_backend
            raise TypeError(f"apply_model: the workers run in other processes (distributed_executor_backend="
                            f"{backend!r}), where a function cannot go: forkless sends no pickled code. Put the "
                            "code in a worker method (worker_extension_cls='pkg.module.Class', whose methods can "
                            "use self.get_model()) and call it with collective_rpc('name'), or use "
                            "distributed_executor_backend='uni'")
        return self.llm_engine.collective_rpc("apply_model", args=(func,))

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (needs ``enable_sleep_mode=True``): free the KV cache, whose
        contents (and the prefix cache) are forgotten; ``level=2`` frees the weights too.
        Generation is refused until :meth:`wake_up`.

        forkless's level 1 leaves the weights where they are (vLLM moves them from the GPU
        to host memory); its level 2 wake-up loads them again from the model's files (vLLM
        leaves them for the caller to load).

        Raises:
            ValueError: Sleep mode is off, or ``level`` is not 1 or 2.
            RuntimeError: Requests are in flight, or the engine sleeps already.
        """
        self.llm_engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Allocate again what :meth:`sleep` freed: ``tags`` among ``"weights"`` and
        ``"kv_cache"`` (``None``: everything). The KV cache comes back empty.

        Raises:
            ValueError: An unknown tag.
            RuntimeError: The engine does not sleep, or ``"kv_cache"`` is woken before
                ``"weights"`` after a level-2 sleep.
        """
        self.llm_engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        """Whether the engine sleeps (:meth:`sleep`) and is not fully woken."""
        return self.llm_engine.is_sleeping()

    def start_profile(self) -> None:
        """Start torch's profiler on every worker, as vLLM's ``LLM.start_profile``: CPU
        activity, and CUDA kernels on a GPU, until :meth:`stop_profile`. Needs
        ``profiler_config={"profiler": "torch", "torch_profiler_dir": DIR}`` (with vLLM's
        ``torch_profiler_record_shapes`` / ``_with_memory`` / ``_with_stack`` /
        ``_with_flops`` flags, all off by default).

        Raises:
            RuntimeError: No ``profiler_config``, or the profiler runs already.
        """
        if self._profiler is None:
            raise RuntimeError("LLM.start_profile(): profiling is off: build the LLM with profiler_config="
                               "{'profiler': 'torch', 'torch_profiler_dir': DIR}")
        trace_dir, flags = self._profiler
        self.llm_engine.collective_rpc("start_profile", args=(trace_dir, flags))

    def stop_profile(self) -> None:
        """Stop the profiler and write each worker's trace to ``torch_profiler_dir``
        (``rank<N>.*.pt.trace.json``, for Perfetto or TensorBoard).

        Raises:
            RuntimeError: Profiling is off, or :meth:`start_profile` was not called.
        """
        if self._profiler is None:
            raise RuntimeError("LLM.stop_profile(): profiling is off: build the LLM with profiler_config="
                               "{'profiler': 'torch', 'torch_profiler_dir': DIR}")
        self.llm_engine.collective_rpc("stop_profile")

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: ProgressBar = True,
        priority: int | Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        *,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate completions for prompts, batched by the engine.

        Args:
            prompts: One prompt or a list: text, token ids (a list of ints is one
                prompt), or ``{"prompt": ...}`` / ``{"prompt_token_ids": ...}`` dicts.
            sampling_params: One for all prompts, one per prompt, or ``None`` for
                :meth:`get_default_sampling_params`.
            use_tqdm: Show a progress bar over requests; a callable makes it, as vLLM's
                (``use_tqdm(total=..., desc=..., dynamic_ncols=True)``, e.g. a
                ``functools.partial`` of ``tqdm``).
            priority: One priority for every prompt, or a list with one per prompt (lower
                runs first; a non-zero one needs ``scheduling_policy="priority"``).
            lora_request: A LoRA adapter for every prompt, or a list with one adapter (or
                ``None``: the base model) per prompt; needs ``enable_lora=True``.
            tokenization_kwargs: vLLM's tokenizer overrides: ``add_special_tokens`` (text
                prompts; default True) and ``truncate_prompt_tokens`` (keep each prompt's
                last this many tokens, as vLLM's generation does; ``-1``: ``max_model_len``,
                as vLLM's ``LLM``, which leaves a cut prompt no room to generate: it is
                refused, as there; a cut prompt's ``prompt`` is the text of the tokens
                kept). Other keys are refused.

        Returns:
            One finished ``RequestOutput`` per prompt, in input order.

        Raises:
            ValueError: An invalid prompt, parameter, adapter or tokenization argument;
                nothing is left running.
        """
        prompt_list = self._as_list(prompts)
        if tokenization_kwargs is not None:
            prompt_list = self._tokenize_for_generation(prompt_list, tokenization_kwargs, add_special_default=True)
        return self._run(prompt_list, sampling_params, use_tqdm, priority, lora_request)

    def beam_search(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        use_tqdm: ProgressBar = False,
        concurrency_limit: int | None = None,
    ) -> list[BeamSearchOutput]:
        """The ``params.beam_width`` most likely continuations of each prompt (vLLM's API;
        the algorithm: :mod:`forkless.beam_search`).

        Args:
            prompts: One prompt or a list, in any form :meth:`generate` takes.
            params: Beam width, length and scoring.
            lora_request: One adapter for every prompt, or one (or ``None``) per prompt.
            use_tqdm: Show a progress bar over the prompts (or a callable making it, as in
                :meth:`generate`).
            concurrency_limit: Search at most this many prompts at once (default: all).

        Returns:
            One :class:`~forkless.beam_search.BeamSearchOutput` per prompt, in order, its
            sequences best first; each sequence's ``tokens`` and ``text`` start with the
            prompt, as vLLM's.

        Raises:
            ValueError: An invalid prompt or parameter, or a beam width whose
                ``2 * beam_width`` logprobs a step are over ``max_logprobs``.
        """
        from forkless.beam_search import BeamSearch

        if not isinstance(params, BeamSearchParams):
            raise TypeError(f"params must be BeamSearchParams, got {type(params).__name__}")
        mc = self.llm_engine.config.model_config
        prompt_list = self._as_list(prompts)
        loras = self._per_prompt(lora_request, len(prompt_list), "lora_request")
        token_ids = [self.llm_engine.processor.prompt_token_ids(p) for p in prompt_list]
        limit = concurrency_limit or len(prompt_list) or 1
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"concurrency_limit={concurrency_limit!r} is invalid: expected an integer >= 1")
        tokenizer = self.get_tokenizer()
        eos = self.llm_engine.processor.eos_token_id
        results: list[BeamSearchOutput] = []
        with _progress_bar(use_tqdm, len(prompt_list), "Beam search", "prompt") as bar:
            for start in range(0, len(prompt_list), limit):
                chunk = slice(start, start + limit)
                search = BeamSearch(token_ids[chunk], params, eos, mc, loras[chunk])
                while requests := search.requests():
                    prompts_now, adapters = zip(*requests)
                    search.advance(self._run(list(prompts_now), search.step_params, False, None, list(adapters)))
                results += search.results(tokenizer, with_prompt=True)  # vLLM's text: prompt + output
                bar.update(len(token_ids[chunk]))
        return results

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: ProgressBar = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        priority: int | Sequence[int] | None = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to conversations, rendered with the tokenizer's chat template.

        The arguments are vLLM's, in vLLM's order.

        Args:
            messages: One conversation (a list of ``{"role", "content"}`` dicts) or a
                list of conversations.
            sampling_params: As in :meth:`generate`.
            use_tqdm: As in :meth:`generate`.
            lora_request: As in :meth:`generate` (one per conversation, or one for all).
            priority: As in :meth:`generate` (one per conversation, or one for all).
            chat_template: A Jinja template overriding the tokenizer's.
            chat_template_content_format: How the template gets each message's content:
                ``"string"`` (one string; text parts joined by newlines), ``"openai"`` (a
                list of ``{"type": "text", "text": ...}`` parts), or ``"auto"`` (``"string"``).
            add_generation_prompt: End the prompt with the assistant turn's header.
            continue_final_message: Let the model continue the last message instead.
            tools: Tool schemas for the template.
            chat_template_kwargs: Extra template variables.
            tokenization_kwargs: As in :meth:`generate`, for the rendered prompt, except
                that ``add_special_tokens`` defaults to False (as in vLLM: the template
                writes its special tokens itself).
            mm_processor_kwargs: Only ``None``: forkless's models read text only.

        Returns:
            One ``RequestOutput`` per conversation, in order.

        Raises:
            ValueError: An empty list of conversations, a content format other than the
                three, ``mm_processor_kwargs``, both ``add_generation_prompt`` and
                ``continue_final_message``, a message the template cannot render, or a
                tokenization argument that is unknown or out of range.
        """
        if mm_processor_kwargs:
            raise ValueError("mm_processor_kwargs: forkless's models read text only")
        if not messages:
            raise ValueError("messages is empty: pass a conversation (a list of message dicts) or a list of them")
        if add_generation_prompt and continue_final_message:
            # (vLLM's ValueError, as transformers' apply_chat_template raises it; the server's 400.)
            raise ValueError("continue_final_message=True and add_generation_prompt=True cannot be combined: "
                             "pass add_generation_prompt=False to continue the last message")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        processor = self.llm_engine.processor
        prompts = [
            processor.apply_chat_template(
                conv,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                chat_template_kwargs=chat_template_kwargs,
                content_format=chat_template_content_format,
            )
            for conv in conversations
        ]
        if tokenization_kwargs is not None:
            prompts = self._tokenize_for_generation(prompts, tokenization_kwargs, add_special_default=False)
        return self._run(prompts, sampling_params, use_tqdm, priority, lora_request)

    # ------------------------------------------------------------------- pooling

    def encode(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: ProgressBar = True,
        pooling_task: str | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> list[PoolingRequestOutput]:
        """Pool prompts with a pooling model (``--runner pooling``), batched by the engine.

        Args:
            prompts: One prompt or a list (text, token ids, or prompt dicts).
            pooling_params: One for all prompts, one per prompt, or ``None`` (the model's
                defaults).
            use_tqdm: As in :meth:`generate`.
            pooling_task: ``embed``, ``classify``, ``score``, ``token_embed``... for every
                prompt whose parameters name none (``None``: the model's task).
            truncate_prompt_tokens: Keep each prompt's first this many tokens (``-1``:
                ``max_model_len``), as the server's field; vLLM's keyword, which it also
                takes in ``tokenization_kwargs``.
            lora_request: Only ``None`` (or ``None`` per prompt): pooling models run
                without LoRA adapters here.
            tokenization_kwargs: vLLM's tokenizer overrides: ``truncate_prompt_tokens``
                and ``add_special_tokens`` (texts only; default True); other keys are refused.

        Returns:
            One ``PoolingRequestOutput`` per prompt, in input order (``outputs.data`` a
            float32 numpy array).

        Raises:
            ValueError: The model is not a pooling model, an input is invalid, a LoRA
                adapter, or a tokenization argument that is unknown or out of range;
                nothing is left running.
        """
        prompt_list = self._as_list(prompts)
        if pooling_params is None or isinstance(pooling_params, PoolingParams):
            params_list = [pooling_params or PoolingParams()] * len(prompt_list)
        else:
            params_list = list(pooling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(f"got {len(params_list)} pooling_params for {len(prompt_list)} prompts: pass "
                                 "one, or one per prompt")
        if pooling_task is not None:
            params_list = [p if p.task is not None else msgspec.structs.replace(p, task=pooling_task)
                           for p in params_list]
        _no_lora(lora_request)
        limit, add_special = self._tokenization(truncate_prompt_tokens, tokenization_kwargs)
        engine = self.llm_engine
        texts = [i for i, p in enumerate(prompt_list) if _text_of(p) is not None]
        prompt_list = list(prompt_list)
        if texts:  # one batch call into the tokenizer, not one per text
            kwargs: dict[str, Any] = {"add_special_tokens": add_special}
            if limit is not None:
                kwargs.update(truncation=True, max_length=limit)
            encoded = engine.get_tokenizer()([_text_of(prompt_list[i]) for i in texts], **kwargs)["input_ids"]
            for i, token_ids in zip(texts, encoded):
                prompt = prompt_list[i]
                prompt_list[i] = ({**prompt, "prompt_token_ids": list(token_ids)} if isinstance(prompt, dict)
                                  else {"prompt": prompt, "prompt_token_ids": list(token_ids)})
        if limit is not None:
            prompt_list = [_cut(p, limit) for p in prompt_list]
        ids = [str(next(self._counter)) for _ in prompt_list]
        added: list[str] = []
        try:
            for i in longest_first(prompt_list):  # outputs in input order all the same
                engine.add_pooling_request(ids[i], prompt_list[i], params_list[i])
                added.append(ids[i])
            return self._run_engine(ids, use_tqdm)  # type: ignore[return-value]
        except BaseException:
            engine.abort_request(added)
            raise

    def embed(self, prompts: PromptType | Sequence[PromptType],
              pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
              use_tqdm: ProgressBar = True, *, truncate_prompt_tokens: int | None = None,
              lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
              tokenization_kwargs: dict[str, Any] | None = None) -> list[EmbeddingRequestOutput]:
        """Embeddings of prompts (``outputs.embedding``, a list of floats), as vLLM's
        ``LLM.embed``; the keyword arguments as in :meth:`encode`."""
        outs = self.encode(prompts, pooling_params, use_tqdm, pooling_task="embed",
                           truncate_prompt_tokens=truncate_prompt_tokens, lora_request=lora_request,
                           tokenization_kwargs=tokenization_kwargs)
        return [EmbeddingRequestOutput.from_base(o) for o in outs]

    def classify(self, prompts: PromptType | Sequence[PromptType],
                 pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
                 use_tqdm: ProgressBar = True, *,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                 tokenization_kwargs: dict[str, Any] | None = None) -> list[ClassificationRequestOutput]:
        """Class probabilities of prompts (``outputs.probs``), as vLLM's ``LLM.classify``;
        the keyword arguments as in :meth:`encode`."""
        outs = self.encode(prompts, pooling_params, use_tqdm, pooling_task="classify", lora_request=lora_request,
                           tokenization_kwargs=tokenization_kwargs)
        return [ClassificationRequestOutput.from_base(o) for o in outs]

    def reward(self, prompts: PromptType | Sequence[PromptType],
               pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
               use_tqdm: ProgressBar = True, *, truncate_prompt_tokens: int | None = None,
               lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
               tokenization_kwargs: dict[str, Any] | None = None) -> list[PoolingRequestOutput]:
        """Per-token scores of a reward (classifier) model, as vLLM's ``LLM.reward``:
        ``outputs.data`` is ``[prompt tokens, labels]``, the classifier head on every
        token's hidden state (its activation applied; vLLM's ``token_classify`` task). The
        keyword arguments as in :meth:`encode`."""
        return self.encode(prompts, pooling_params, use_tqdm, pooling_task="token_classify",
                           truncate_prompt_tokens=truncate_prompt_tokens, lora_request=lora_request,
                           tokenization_kwargs=tokenization_kwargs)

    def score(self, data_1: str | Sequence[str], data_2: str | Sequence[str],
              use_tqdm: ProgressBar = True, *, pooling_params: PoolingParams | None = None,
              lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
              tokenization_kwargs: dict[str, Any] | None = None,
              chat_template: str | None = None) -> list[ScoringRequestOutput]:
        """Relevance of text pairs, as vLLM's ``LLM.score``.

        One ``data_1`` is paired with every ``data_2``; otherwise the lists pair up one to
        one. A cross-encoder (a classifier with one label) scores each pair in one pass
        (the sigmoid of its logit); an embedding model scores the cosine similarity of
        the two embeddings.

        Args:
            data_1: A text, or a list.
            data_2: A text, or a list.
            use_tqdm: As in :meth:`generate`.
            pooling_params: For every request (its task, if set, must be the one the
                model scores with: ``score`` for a cross-encoder, ``embed`` otherwise).
            lora_request: Only ``None``, as in :meth:`encode`.
            tokenization_kwargs: As in :meth:`encode`; a cross-encoder's pair is truncated
                to ``truncate_prompt_tokens``, the longer text first.
            chat_template: Only ``None``: forkless has no score templates.

        Returns:
            One ``ScoringRequestOutput`` per pair (``outputs.score``), in order.

        Raises:
            ValueError: Lists of different lengths, a model that cannot score, or an
                argument it cannot honour (above).
        """
        left = [data_1] if isinstance(data_1, str) else list(data_1)
        right = [data_2] if isinstance(data_2, str) else list(data_2)
        if len(left) == 1:
            left = left * len(right)
        if len(left) != len(right) or not right:
            raise ValueError(f"score: {len(left)} texts to pair with {len(right)}: pass one text and a list, "
                             "or two lists of the same (non-zero) length")
        pooler = self.llm_engine.config.model_config.pooler_config
        if pooler is None or "score" not in pooler.tasks:
            raise ValueError("this model cannot score pairs: it needs a cross-encoder (a classifier with one "
                             "label) or an embedding model")
        if chat_template is not None:
            raise ValueError("score(chat_template=...): forkless has no score templates; the pair is the "
                             "tokenizer's text-pair encoding")
        if pooling_params is not None and not isinstance(pooling_params, PoolingParams):
            raise TypeError(f"score pooling_params must be one PoolingParams or None, got "
                            f"{type(pooling_params).__name__}")
        _no_lora(lora_request)
        task = "score" if pooler.task == "classify" else "embed"
        params = pooling_params or PoolingParams()
        if params.task not in (None, task):
            raise ValueError(f"score: pooling_params.task={params.task!r}, but this model scores with the "
                             f"{task!r} task")
        params = msgspec.structs.replace(params, task=task)
        if task == "score":
            limit, add_special = self._tokenization(None, tokenization_kwargs)
            if add_special is not True:
                raise ValueError("score: add_special_tokens=False is not supported for a cross-encoder: its "
                                 "pair needs the separator tokens")
            processor = self.llm_engine.processor
            pairs = [processor.tokenize_pair(a, b, limit) for a, b in zip(left, right)]
            outs = self.encode(pairs, params, use_tqdm)
            return [ScoringRequestOutput(o.request_id, ScoringOutput(float(o.outputs.data.reshape(-1)[0])),
                                         o.prompt_token_ids, o.num_cached_tokens) for o in outs]
        texts = list(dict.fromkeys([*left, *right]))
        encoded = self.encode(texts, params, use_tqdm, tokenization_kwargs=tokenization_kwargs)
        vectors = {t: o.outputs.data for t, o in zip(texts, encoded)}
        out = []
        for i, (a, b) in enumerate(zip(left, right)):
            va, vb = vectors[a], vectors[b]
            cos = float((va @ vb) / max(float(np.linalg.norm(va) * np.linalg.norm(vb)), 1e-12))
            out.append(ScoringRequestOutput(f"score-{i}", ScoringOutput(cos), []))
        return out

    def _tokenization(self, truncate_prompt_tokens: int | None,
                      tokenization_kwargs: dict[str, Any] | None) -> tuple[int | None, bool]:
        """What ``truncate_prompt_tokens`` and vLLM's ``tokenization_kwargs`` ask of a pooling
        or generation call: how many tokens to keep of each prompt (``None``: all) and
        whether texts get the tokenizer's special tokens.

        Raises:
            ValueError: An unknown key, both spellings of the truncation with different
                values, or a value out of range.
            TypeError: ``tokenization_kwargs`` is not a dict.
        """
        if tokenization_kwargs is not None and not isinstance(tokenization_kwargs, dict):
            raise TypeError(f"tokenization_kwargs must be a dict, got {type(tokenization_kwargs).__name__}")
        extra = dict(tokenization_kwargs or {})
        unknown = sorted(set(extra) - {"truncate_prompt_tokens", "add_special_tokens"})
        if unknown:
            raise ValueError(f"tokenization_kwargs {unknown} are not supported: forkless takes "
                             "truncate_prompt_tokens and add_special_tokens")
        keep = extra.get("truncate_prompt_tokens")
        if truncate_prompt_tokens is not None:
            if keep is not None and keep != truncate_prompt_tokens:
                raise ValueError(f"truncate_prompt_tokens={truncate_prompt_tokens} and tokenization_kwargs' "
                                 f"{keep} disagree: pass one")
            keep = truncate_prompt_tokens
        add_special = extra.get("add_special_tokens", True)
        if not isinstance(add_special, bool):
            raise ValueError(f"add_special_tokens={add_special!r} is invalid: expected True or False")
        if keep is None:
            return None, add_special
        max_len = self.llm_engine.config.model_config.max_model_len
        if isinstance(keep, bool) or not isinstance(keep, int) or not (keep == -1 or 0 < keep <= max_len):
            raise ValueError(f"truncate_prompt_tokens={keep!r} is invalid: expected 1 to max_model_len = "
                             f"{max_len}, or -1 (max_model_len)")
        return (max_len if keep == -1 else keep), add_special

    def _tokenize_for_generation(self, prompts: list[Any], tokenization_kwargs: dict[str, Any],
                                 add_special_default: bool) -> list[Any]:
        """Generation prompts as ``tokenization_kwargs`` asks (see :meth:`generate`): texts
        tokenized with or without the special tokens, every prompt cut to its last
        ``truncate_prompt_tokens`` tokens.

        A text prompt (a string, or a dict with ``prompt`` and no ``prompt_token_ids``) is
        tokenized with ``add_special_tokens`` (``add_special_default`` when not given);
        a rendered chat prompt (``prompt`` and ``prompt_token_ids``, encoded without
        them) is tokenized again only when ``add_special_tokens`` is True; token ids are
        taken as they are.

        Raises:
            ValueError, TypeError: As :meth:`_tokenization`; an invalid prompt.
        """
        limit, add_special = self._tokenization(None, tokenization_kwargs)
        if "add_special_tokens" not in tokenization_kwargs:
            add_special = add_special_default
        if limit is None and add_special is add_special_default and add_special_default is False:
            return prompts  # (chat, nothing asked: the template's own tokens)
        processor = self.llm_engine.processor
        tokenizer = processor.tokenizer
        out = []
        for prompt in prompts:
            text = _text_of(prompt)
            if text is None and add_special and isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
                text = prompt["prompt"]  # a rendered chat prompt, to encode with the special tokens
            if text is not None:
                ids = list(tokenizer.encode(text, add_special_tokens=add_special))
            elif limit is None:
                out.append(prompt)
                continue
            else:
                ids = processor.prompt_token_ids(prompt)
                text = prompt.get("prompt") if isinstance(prompt, dict) else None
            if limit is not None and len(ids) > limit:
                ids = ids[-limit:]  # vLLM cuts a generation prompt on the left
                text = tokenizer.decode(ids) if text is not None else None
            extra = {k: v for k, v in prompt.items() if k not in ("prompt", "prompt_token_ids")} \
                if isinstance(prompt, dict) else {}
            out.append({**extra, "prompt": text, "prompt_token_ids": ids} if text is not None
                       else {**extra, "prompt_token_ids": ids})
        return out

    # ------------------------------------------------------------------- helpers

    @staticmethod
    def _as_list(prompts: Any) -> list[Any]:
        if isinstance(prompts, (str, dict)):
            return [prompts]
        if not isinstance(prompts, collections.abc.Iterable) or isinstance(prompts, bytes):
            raise ValueError(f"prompts={prompts!r:.100} is not a prompt: expected a string, token ids, a prompt "
                             "dict (TextPrompt / TokensPrompt) or a list of them")
        prompts = list(prompts)
        if prompts and all(isinstance(t, int) for t in prompts):
            return [prompts]  # one prompt given as token ids
        return prompts

    @staticmethod
    def _per_prompt(value: Any, count: int, name: str) -> list[Any]:
        """One value for every prompt, or a list with one per prompt."""
        if value is None or not isinstance(value, (list, tuple)):
            return [value] * count
        values = list(value)
        if len(values) != count:
            raise ValueError(f"{name} has {len(values)} entries for {count} prompts: pass one, or one per prompt")
        return values

    def _run(
        self,
        prompts: list[Any],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: ProgressBar,
        priority: int | Sequence[int] | None,
        lora_request: Any,
    ) -> list[RequestOutput]:
        if isinstance(sampling_params, dict):
            raise TypeError("sampling_params must be SamplingParams (or a list of them), got a dict: "
                            "use SamplingParams(**...)")
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or self.get_default_sampling_params()] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    f"got {len(params_list)} sampling_params for {len(prompts)} prompts: pass one, "
                    "or one per prompt"
                )
        # generate() returns only finished outputs, so cumulative snapshots every step
        # (a copy of all tokens so far, per request per step) would be built for nothing,
        # and deltas would lose all but the last. The caller's params stay untouched.
        params_list = [_final_only(p) for p in params_list]
        priorities = _priorities(priority, len(prompts))
        loras = self._per_prompt(lora_request, len(prompts), "lora_request")
        engine = self.llm_engine
        ids: list[str] = []
        try:
            for prompt, params, prio, lora in zip(prompts, params_list, priorities, loras):
                request_id = str(next(self._counter))
                engine.add_request(request_id, prompt, params, priority=prio, lora_request=lora)
                ids.append(request_id)
            return self._run_engine(ids, use_tqdm)
        except BaseException:
            engine.abort_request(ids)
            raise

    def _run_engine(self, ids: list[str], use_tqdm: ProgressBar) -> list[RequestOutput]:
        engine = self.llm_engine
        finished: dict[str, RequestOutput] = {}
        with _progress_bar(use_tqdm, len(ids), "Processed prompts", "req") as bar, paused_full_collections():
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
        return [finished[i] for i in ids]

    def shutdown(self) -> None:
        """Stop the engine's workers."""
        self.llm_engine.shutdown()


def _priorities(priority: Any, count: int) -> list[int]:
    """``priority`` as one integer per prompt: ``None`` is 0, one integer is every prompt's
    (vLLM's forms).

    Raises:
        ValueError: Something else than an integer or a sequence of them (a string, which
            is a sequence too, included), or a sequence of another length than the prompts.
    """
    if isinstance(priority, collections.abc.Sequence) and not isinstance(priority, str):
        priority = list(priority)  # (a range, say: one per prompt too)
    values = LLM._per_prompt(0 if priority is None else priority, count, "priority")
    if not all(isinstance(p, int) and not isinstance(p, bool) for p in values):
        raise ValueError(f"priority={priority!r:.100} is invalid: expected an integer, or a list with one integer "
                         "per prompt")
    return values


def _no_lora(lora_request: Any) -> None:
    """Refuse a LoRA adapter for a pooling call (``None``, or ``None`` per prompt, is fine).

    Raises:
        ValueError: An adapter: pooling models run without LoRA here.
    """
    adapters = lora_request if isinstance(lora_request, (list, tuple)) else [lora_request]
    named = [a for a in adapters if a is not None]
    if named:
        raise ValueError(f"lora_request={named[0]!r}: pooling models run without LoRA adapters in forkless "
                         "(--enable-lora is for generation)")


def _text_of(prompt: Any) -> str | None:
    """A pooling prompt's text where it still needs tokenizing (a string, or a dict with
    ``prompt`` and no ``prompt_token_ids``), else ``None``."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict) and "prompt_token_ids" not in prompt and isinstance(prompt.get("prompt"), str):
        return prompt["prompt"]
    return None


def _cut(prompt: Any, limit: int) -> Any:
    """``prompt`` (token ids, or a dict of them) cut to its first ``limit`` tokens, its
    segment ids with them."""
    if isinstance(prompt, dict):
        cut = dict(prompt)
        for key in ("prompt_token_ids", "token_type_ids"):
            if cut.get(key) is not None:
                cut[key] = list(cut[key])[:limit]
        return cut
    return list(prompt)[:limit]


def _final_only(params: SamplingParams | None) -> SamplingParams | None:
    """``params`` asking for the finished output only, as vLLM's LLM does: generate() keeps
    one output per request, so a DELTA request would return its last step alone."""
    if params is None or params.output_kind is RequestOutputKind.FINAL_ONLY:
        return params
    if not isinstance(params, SamplingParams):
        raise TypeError(f"sampling_params must be SamplingParams, got {type(params).__name__}")
    # A shallow copy is enough: only this scalar field differs.
    return msgspec.structs.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)


@contextlib.contextmanager
def _progress_bar(use_tqdm: ProgressBar, total: int, desc: str, unit: str) -> Iterator[Any]:
    """The progress bar ``use_tqdm`` asks for, closed on exit.

    ``True`` and ``False`` show tqdm's bar or a disabled one; a callable (vLLM's other
    form) makes the bar, called with the keyword arguments vLLM gives it (``total``,
    ``desc``, ``dynamic_ncols``) and nothing else, so that a callable written for vLLM
    fits. What it returns needs ``update(n)`` and ``close()``, as vLLM's loop uses.
    """
    if callable(use_tqdm):
        bar = use_tqdm(total=total, desc=desc, dynamic_ncols=True)
    else:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=desc, unit=unit, disable=not use_tqdm, dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()
