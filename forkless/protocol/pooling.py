"""Request and response bodies of the pooling endpoints (OpenAI's and vLLM's shapes).

``/v1/embeddings`` is OpenAI's; ``/pooling``, ``/classify``, ``/score`` and ``/rerank``
are vLLM's. Invariants: an unknown field is a 400 naming it, and so are vLLM's pooling
fields the server does not implement unless they hold what it does anyway
(``serving_pooling._UNSUPPORTED_POOLING_FIELDS``); a field of the
wrong type or value is a 400 naming it (pydantic's validation, turned into an OpenAI-style
error by the server).
"""

from __future__ import annotations

import time
from typing import Any, Literal, Union

from pydantic import Field

from forkless.protocol.openai import ChatMessage, OpenAIModel, RequestModel, UsageInfo

# An input: one text, texts, one token-id list, or token-id lists (OpenAI's ``input``).
PoolingInput = Union[str, list[str], list[int], list[list[int]]]


class _PoolingRequestBase(RequestModel):
    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    priority: int = 0
    request_id: str | None = None


# vLLM's encodings of pooled values: JSON floats, base64 in the JSON, or the raw bytes as
# the body (``bytes``: with a ``metadata`` header of JSON; ``bytes_only``: without).
EncodingFormat = Literal["float", "base64", "bytes", "bytes_only"]
# vLLM's binary options: the values' type and byte order (the float encoding is JSON's).
EmbedDType = Literal["float32", "float16", "bfloat16"]
Endianness = Literal["native", "little", "big"]


class _InputsRequest(_PoolingRequestBase):
    """A request of ``input`` prompts (not pairs), or of one conversation in ``messages``
    (vLLM's chat form: the chat template makes the prompt, as for a chat completion).
    vLLM's ``add_special_tokens`` applies to ``input``'s texts (``false``: no [CLS] /
    [SEP] or BOS; token ids are taken as given); with ``messages`` the template writes
    the special tokens, and ``true`` is refused, as chat completions refuse it."""

    input: PoolingInput | None = None
    add_special_tokens: bool = True
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None  # as chat completions' (--trust-request-chat-template)
    chat_template_kwargs: dict[str, Any] | None = None


class EmbeddingRequest(_InputsRequest):
    """``POST /v1/embeddings``."""

    encoding_format: EncodingFormat = "float"
    embed_dtype: EmbedDType = "float32"
    endianness: Endianness = "native"
    dimensions: int | None = Field(default=None, ge=1)
    normalize: bool | None = None


class PoolingRequest(_InputsRequest):
    """``POST /pooling``: ``input`` through the model's pooler, or ``data`` through the
    server's IO processor plugin (``--io-processor-plugin``)."""

    data: Any = None
    task: str | None = None
    encoding_format: EncodingFormat = "float"
    embed_dtype: EmbedDType = "float32"
    endianness: Endianness = "native"
    dimensions: int | None = Field(default=None, ge=1)
    normalize: bool | None = None
    use_activation: bool | None = None


#: vLLM's type of a ``/pooling`` request with ``data`` (what an IO processor's earlier
#: ``parse_request`` gets): forkless's ``PoolingRequest``, which carries ``data`` itself.
IOProcessorRequest = PoolingRequest


class ClassificationRequest(_InputsRequest):
    """``POST /classify``."""

    use_activation: bool | None = None


class _PairsRequest(_PoolingRequestBase):
    """A request of text pairs (``/score``, ``/rerank``). ``use_activation``: a
    cross-encoder's sigmoid on its relevance logit (``false``: the raw logit; an embedding
    model's cosine similarity has none)."""

    use_activation: bool | None = None


class ScoreRequest(_PairsRequest):
    """``POST /score``: ``text_1`` against each ``text_2``, under any of vLLM's pairs of
    names (``text_1`` / ``text_2``, ``queries`` / ``documents`` or ``items``, ``data_1`` /
    ``data_2``)."""

    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    items: str | list[str] | None = None
    data_1: str | list[str] | None = None
    data_2: str | list[str] | None = None


class RerankRequest(_PairsRequest):
    """``POST /rerank``: documents ordered by relevance to ``query``."""

    query: str
    documents: str | list[str]  # one document, or several (vLLM takes either)
    top_n: int | None = Field(default=None, ge=0)
    return_documents: bool = True


class _ListResponse(OpenAIModel):
    """OpenAI's list envelope: every pooling response but rerank's and an IO processor's."""

    id: str
    object: str = "list"
    created: int
    model: str
    usage: UsageInfo


class EmbeddingData(OpenAIModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(_ListResponse):
    data: list[EmbeddingData]


class PoolingData(OpenAIModel):
    index: int
    object: str = "pooling"
    data: list[Any] | str


class PoolingResponse(_ListResponse):
    data: list[PoolingData]


class IOProcessorResponse(OpenAIModel):
    """``/pooling`` answered by an IO processor plugin: its output as ``data``."""

    request_id: str | None = None
    created_at: int = Field(default_factory=lambda: int(time.time()))
    data: Any


class ClassificationData(OpenAIModel):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(_ListResponse):
    data: list[ClassificationData]


class ScoreData(OpenAIModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(_ListResponse):
    data: list[ScoreData]


class RerankDocument(OpenAIModel):
    text: str


class RerankResult(OpenAIModel):
    index: int
    document: RerankDocument | None = None
    relevance_score: float


class RerankUsage(OpenAIModel):
    """vLLM's rerank usage: prompt tokens, and the total (the same: nothing is generated)."""

    prompt_tokens: int
    total_tokens: int


class RerankResponse(OpenAIModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
