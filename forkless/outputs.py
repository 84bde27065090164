"""What a generation request returns to its caller (vLLM-compatible shapes).

The generation outputs are ``msgspec.Struct``s so that they can cross a process boundary
as msgpack. The pooling outputs (``PoolingRequestOutput`` and vLLM's task-shaped variants)
hold numpy arrays and are built where they are used: pooled values cross processes as
``forkless.pooling_params.PooledData``.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Logprob(msgspec.Struct, omit_defaults=True):
    """The log-probability of one candidate token at one position.

    Attributes:
        logprob: Natural-log probability.
        rank: 1-based rank of the token in the distribution (1 = most likely).
        decoded_token: The token's text, once detokenized.
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per generated (or prompt) position: token id -> its Logprob. The sampled token
# is always present; up to ``SamplingParams.logprobs`` more of the most likely tokens too.
SampleLogprobs = list[dict[int, Logprob]]
# Same, for prompt positions; the first prompt token has no distribution, hence None.
PromptLogprobs = list[dict[int, Logprob] | None]


class CompletionOutput(msgspec.Struct, kw_only=True, gc=False):
    """One completion of a request (a request with ``n > 1`` has several).

    A streaming server makes one per stream per step: not tracked by the garbage
    collector (it holds no cycles), so collections do not scan them.

    Attributes:
        index: Which of the request's ``n`` completions this is.
        text: The generated text.
        token_ids: The generated token ids.
        cumulative_logprob: Sum of the sampled tokens' logprobs, when logprobs were asked.
        logprobs: Per generated token, the requested logprobs; ``None`` when not asked.
        finish_reason: ``"stop"``, ``"length"``, ``"abort"``, or ``None`` while running.
        stop_reason: The stop string or stop token id that ended it, if any.
        lora_request: The LoRA adapter it was generated with (the request's), if any.
            (vLLM has the field but leaves it ``None``.)
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any = None  # a forkless.lora.LoRARequest (this leaf module imports none)

    def finished(self) -> bool:
        """Whether this completion is done."""
        return self.finish_reason is not None

    def add(self, later: CompletionOutput) -> None:
        """Append a later ``DELTA`` output of the same completion to this one (in place).

        Text, token ids and logprobs are concatenated; the cumulative logprob, finish and
        stop reasons are the later one's.
        """
        self.text += later.text
        self.token_ids.extend(later.token_ids)
        if later.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = list(later.logprobs)
            else:
                self.logprobs.extend(later.logprobs)
        self.cumulative_logprob = later.cumulative_logprob
        self.finish_reason = later.finish_reason
        self.stop_reason = later.stop_reason


class RequestOutput(msgspec.Struct, kw_only=True, gc=False):
    """The state of one request, as returned by ``LLM.generate`` or streamed by ``AsyncLLM``.

    Attributes:
        request_id: The request's id.
        prompt: The prompt text, when the request had one.
        prompt_token_ids: The prompt's token ids.
        outputs: One ``CompletionOutput`` per completion.
        finished: Whether every completion is done.
        prompt_logprobs: Per prompt token, the requested logprobs (``None`` at position 0).
        num_cached_tokens: How many prompt tokens were served from the prefix cache.
        lora_request: The LoRA adapter the request ran with, if any.
        metrics: vLLM's per-request statistics, a
            ``forkless.metrics.stats.RequestStateStats`` (also importable as
            ``forkless.v1.metrics.stats.RequestStateStats``) from the offline
            ``LLM(disable_log_stats=False)`` and from ``AsyncLLM`` with statistics on
            (its default; off with ``log_stats=False`` and no stat loggers); ``None``
            otherwise, as in vLLM's ``LLM`` by default (``disable_log_stats=True``).

        kv_transfer_params: In the finished output, what the KV connector's
            ``request_finished`` returned for the client (vLLM's hand-over of a prefilled
            request to a decode engine), else ``None``.

    vLLM's ``encoder_prompt``, ``encoder_prompt_token_ids`` and
    ``num_cache_creation_tokens`` are read-only ``None`` here (properties, not fields):
    forkless has no encoder-decoder models and does not count a request's prefix-cache
    writes.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int | None = None
    lora_request: Any = None  # a forkless.lora.LoRARequest (this leaf module imports none)
    kv_transfer_params: dict[str, Any] | None = None
    # vLLM scripts read it (``if out.metrics is not None: ...``); a RequestStateStats
    # (forkless.metrics, which this leaf module does not import) or None.
    metrics: Any = None

    @property
    def encoder_prompt(self) -> None:
        """vLLM's encoder prompt text: always ``None`` (forkless runs decoder-only models)."""
        return None

    @property
    def encoder_prompt_token_ids(self) -> None:
        """vLLM's encoder prompt ids: always ``None`` (forkless runs decoder-only models)."""
        return None

    @property
    def num_cache_creation_tokens(self) -> None:
        """vLLM's count of the prompt tokens written to the prefix cache: ``None``, not
        counted by forkless (``num_cached_tokens`` counts the hits)."""
        return None

    def add(self, later: RequestOutput, aggregate: bool = True) -> None:
        """Fold a later output of the same request into this one (in place), as vLLM's
        ``RequestOutput.add``.

        With ``aggregate`` (``DELTA`` outputs a slow reader has not taken yet) each
        completion's text, token ids and logprobs are concatenated, per completion index (a
        ``DELTA`` output may carry only the completions that changed); without it the later
        completions replace the earlier ones. The prompt logprobs are the first that came;
        ``finished``, ``num_cached_tokens`` and ``kv_transfer_params`` are the later output's.
        """
        self.finished = later.finished
        self.num_cached_tokens = later.num_cached_tokens
        self.kv_transfer_params = later.kv_transfer_params
        if self.prompt_logprobs is None:
            self.prompt_logprobs = later.prompt_logprobs
        outputs = self.outputs
        for completion in later.outputs:
            for i, mine in enumerate(outputs):
                if mine.index == completion.index:
                    if aggregate:
                        mine.add(completion)
                    else:
                        outputs[i] = completion
                    break
            else:
                outputs.append(completion)
                if len(outputs) > 1 and outputs[-2].index > completion.index:
                    outputs.sort(key=lambda c: c.index)


class PoolingOutput:
    """A pooling request's result (vLLM's ``PoolingOutput``).

    Attributes:
        data: float32 numpy array: ``[dim]`` (one vector or one probability per class)
            or ``[tokens, dim]`` (per-token tasks).
    """

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"PoolingOutput(data={self.data!r})"


class PoolingRequestOutput:
    """A finished pooling request, as returned by ``LLM.encode`` or ``AsyncLLM.encode``.

    Attributes:
        request_id: The request's id.
        outputs: Its :class:`PoolingOutput`.
        prompt_token_ids: The prompt's token ids.
        num_cached_tokens: How many prompt tokens were served from the prefix cache, as the
            engine core reports them; always 0 today, since the engine turns prefix
            caching off for pooling models (a pooled prompt runs whole, and an encoder's
            attention reads no cached blocks).
        finished: Always true (a pooling request finishes in one step).
    """

    __slots__ = ("request_id", "outputs", "prompt_token_ids", "num_cached_tokens", "finished")

    # vLLM's positional order: num_cached_tokens before finished.
    def __init__(self, request_id: str, outputs: PoolingOutput, prompt_token_ids: list[int],
                 num_cached_tokens: int = 0, finished: bool = True) -> None:
        self.request_id = request_id
        self.outputs = outputs
        self.prompt_token_ids = prompt_token_ids
        self.num_cached_tokens = num_cached_tokens
        self.finished = finished

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(request_id={self.request_id!r}, outputs={self.outputs!r}, "
                f"prompt_token_ids={self.prompt_token_ids!r}, num_cached_tokens={self.num_cached_tokens})")


class EmbeddingOutput:
    """vLLM's ``EmbeddingOutput``: ``embedding`` is a list of floats."""

    __slots__ = ("embedding",)

    def __init__(self, embedding: list[float]) -> None:
        self.embedding = embedding

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)

    def __repr__(self) -> str:
        return f"EmbeddingOutput(hidden_size={self.hidden_size})"


class ClassificationOutput:
    """vLLM's ``ClassificationOutput``: ``probs`` has one entry per class."""

    __slots__ = ("probs",)

    def __init__(self, probs: list[float]) -> None:
        self.probs = probs

    @property
    def num_classes(self) -> int:
        return len(self.probs)

    def __repr__(self) -> str:
        return f"ClassificationOutput(num_classes={self.num_classes})"


class ScoringOutput:
    """vLLM's ``ScoringOutput``: one relevance score."""

    __slots__ = ("score",)

    def __init__(self, score: float) -> None:
        self.score = score

    def __repr__(self) -> str:
        return f"ScoringOutput(score={self.score})"


class _TaskRequestOutput(PoolingRequestOutput):
    """A ``PoolingRequestOutput`` whose ``outputs`` is a task's shape (``output_cls`` of the values)."""

    output_cls: type = PoolingOutput

    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> Any:
        """The task-shaped view of a pooling result (its values as a flat list)."""
        return cls(out.request_id, cls.output_cls(out.outputs.data.reshape(-1).tolist()), out.prompt_token_ids,
                   out.num_cached_tokens, out.finished)


class EmbeddingRequestOutput(_TaskRequestOutput):
    """``LLM.embed``'s result per prompt: ``outputs.embedding``."""

    output_cls = EmbeddingOutput


class ClassificationRequestOutput(_TaskRequestOutput):
    """``LLM.classify``'s result per prompt: ``outputs.probs``."""

    output_cls = ClassificationOutput


class ScoringRequestOutput(PoolingRequestOutput):
    """``LLM.score``'s result per pair: ``outputs.score``."""

    def __init__(self, request_id: str, outputs: ScoringOutput, prompt_token_ids: list[int],  # type: ignore[override]
                 num_cached_tokens: int = 0, finished: bool = True) -> None:
        super().__init__(request_id, outputs, prompt_token_ids, num_cached_tokens, finished)  # type: ignore[arg-type]
