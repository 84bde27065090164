"""The pooling endpoints: ``/v1/embeddings`` (OpenAI), ``/pooling``, ``/classify``, ``/score``,
``/rerank`` (vLLM; also under ``/v1``, and ``/v2/rerank``).

Invariants:
    * Each input of a request is one engine request (``AsyncLLM.encode``): the engine
      batches them with every other request's, and each finishes after its prompt.
    * Inputs are tokenized in one batch call, in the tokenizer thread, off the event loop.
      ``messages`` (vLLM's chat form of ``/v1/embeddings``, ``/pooling`` and ``/classify``)
      are one prompt, rendered by the chat template as a chat completion's would be.
    * A bad input (empty, too long, token ids outside the vocabulary, a task the model
      does not serve) is a 400 with an OpenAI-style error naming it, before anything runs;
      a pooling model asked for completions, and a generative model asked for pooling,
      are 400s too (the engine's processor refuses them).
    * ``/pooling`` with ``data`` goes through the server's IO processor plugin
      (``--io-processor-plugin``); without one it is a 400.
"""

from __future__ import annotations

import base64
import json
import re
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from forkless.entrypoints.openai.errors import BadRequest
from forkless.entrypoints.openai.serving import refuse_unknown_fields, reject_field
from forkless.logger import init_logger
from forkless.pooling.order import longest_first
from forkless.pooling_params import PoolingParams
from forkless.protocol.openai import UsageInfo, random_id
from forkless.protocol.pooling import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    IOProcessorResponse,
    PoolingData,
    PoolingInput,
    PoolingRequest,
    PoolingResponse,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)

if TYPE_CHECKING:
    from forkless.engine.async_llm import AsyncLLM
    from forkless.entrypoints.openai.serving import OpenAIServing
    from forkless.io_processors import IOProcessor
    from forkless.outputs import PoolingRequestOutput

logger = init_logger(__name__)


# vLLM's pooling fields that this server does not implement: a value other than those
# listed (what the server does anyway) is a 400 naming the field, not silently ignored.
# Any other unknown field is a 400 too (``refuse_unknown_fields``).
_UNSUPPORTED_POOLING_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    "mm_processor_kwargs": ((None, {}), "multimodal inputs are not supported"),
    "max_tokens_per_query": ((None, 0), "per-query truncation is not supported: use truncate_prompt_tokens"),
    "max_tokens_per_doc": ((None, 0), "per-document truncation is not supported: use truncate_prompt_tokens"),
    "truncation_side": ((None, "right"), "truncate_prompt_tokens keeps the first tokens here (right)"),
}


def _binary(values: np.ndarray, req: EmbeddingRequest | PoolingRequest) -> bytes:
    """The values' bytes: float32 (OpenAI's) by default, or vLLM's ``embed_dtype`` float16
    / bfloat16, in ``endianness``'s byte order (``native``: this host's)."""
    order = {"native": "=", "little": "<", "big": ">"}[req.endianness]
    data = np.asarray(values, dtype=np.float32)
    if req.embed_dtype == "float16":
        raw = data.astype(order + "f2")
    elif req.embed_dtype == "bfloat16":
        # The top 16 bits of each float32, rounded to nearest even (as torch casts).
        bits = np.ascontiguousarray(data).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        raw = rounded.astype(order + "u2")
    else:
        raw = data.astype(order + "f4")
    return np.ascontiguousarray(raw).tobytes()


def _encode(values: np.ndarray, req: EmbeddingRequest | PoolingRequest) -> list[Any] | str:
    """Floats as a list, or ``base64`` of :func:`_binary`."""
    if req.encoding_format != "base64":
        return values.tolist()
    return base64.b64encode(_binary(values, req)).decode("ascii")


def _bytes_response(outs: list[PoolingRequestOutput], req: EmbeddingRequest | PoolingRequest,
                    envelope: dict[str, Any]) -> Response:
    """vLLM's ``bytes`` / ``bytes_only`` encodings: every output's :func:`_binary` one after
    another as the body; for ``bytes``, a ``metadata`` header of JSON holds ``envelope``
    (id, created, model, usage) and, per output, its bytes' ``start`` / ``end`` and shape."""
    chunks: list[bytes] = []
    items: list[dict[str, Any]] = []
    offset = 0
    for i, o in enumerate(outs):
        raw = _binary(o.outputs.data, req)
        items.append({"index": i, "embed_dtype": req.embed_dtype, "endianness": req.endianness, "start": offset,
                      "end": offset + len(raw), "shape": list(o.outputs.data.shape)})
        chunks.append(raw)
        offset += len(raw)
    headers = None if req.encoding_format == "bytes_only" else {"metadata": json.dumps({**envelope, "data": items})}
    return Response(b"".join(chunks), media_type="application/octet-stream", headers=headers)


def _response_id(prefix: str, req: Any, raw_request: Any) -> str:
    """``prefix-ID`` where the client gave an id (its ``X-Request-Id`` header, else the
    body's ``request_id``: vLLM's ids), else a random one; an empty one is the client's 400."""
    from forkless.entrypoints.openai.serving import _request_ids

    return _request_ids(prefix, req.request_id, raw_request)[0]


def _refused_param(message: str) -> str:
    """The request field an engine refusal is about: the engine's messages about
    ``dimensions`` and ``priority`` start with ``field=``; any other is about the input."""
    match = re.match(r"(dimensions|priority)=", message)
    return match.group(1) if match else "input"


def _params(**fields: Any) -> PoolingParams:
    """The request's pooling parameters; a bad value is the client's 400, naming it."""
    try:
        return PoolingParams(**fields)
    except ValueError as exc:
        param = "task" if "task" in str(exc) else "dimensions"
        raise BadRequest(str(exc), param) from None


class OpenAIServingPooling:
    """Pooling requests on top of an ``AsyncLLM``.

    Args:
        engine: The engine.
        serving: The completions serving object (model names, the tokenizer thread).
        io_processor: The IO processor plugin for ``/pooling`` ``data``, if one is selected.
    """

    def __init__(self, engine: AsyncLLM, serving: OpenAIServing, io_processor: IOProcessor | None = None) -> None:
        self.engine = engine
        self.serving = serving
        self.io_processor = io_processor
        self._labels: dict[int, str] | None = None

    # Read from the engine when a request needs them, not when the app is built: building
    # the app asks nothing of the engine beyond what /health needs.
    @property
    def pooler(self) -> Any:
        """The model's pooler configuration (``None``: a generative model)."""
        return self.engine.processor.config.model_config.pooler_config

    @property
    def max_model_len(self) -> int:
        return self.engine.processor.config.model_config.max_model_len

    # -- inputs ---------------------------------------------------------------------------
    async def _accept(self, req: Any, endpoint: str) -> None:
        """Check a request before its inputs: the model it names, that the model pools,
        and its fields that no model declares (see :data:`_UNSUPPORTED_POOLING_FIELDS`).

        Raises:
            BadRequest: As :meth:`OpenAIServing.check_model`, and a 400 for a generative
                model or a refused field.
        """
        await self.serving.check_model(req.model)
        self._check_pooling_model(endpoint)
        extra = req.model_extra or {}
        for name, value in extra.items():
            if name in _UNSUPPORTED_POOLING_FIELDS:
                reject_field(name, value, _UNSUPPORTED_POOLING_FIELDS)
        refuse_unknown_fields((name for name in extra if name not in _UNSUPPORTED_POOLING_FIELDS),
                              [*type(req).model_fields, *_UNSUPPORTED_POOLING_FIELDS])

    def _check_pooling_model(self, endpoint: str) -> None:
        if self.pooler is None:
            raise BadRequest(f"{endpoint}: {self.serving.model_name} is a generative model: it has no embeddings "
                             "or classifier (serve a pooling model, or this one with --runner pooling --convert "
                             "embed)", "model")

    @staticmethod
    def _input_list(value: PoolingInput | None) -> list[str | list[int]]:
        if value is None:
            raise BadRequest("input (or messages) is required", "input")
        if isinstance(value, str):
            if not value:  # as OpenAI, and as one empty string in a list is
                raise BadRequest("input is an empty string: give some text", "input")
            return [value]
        if not value:
            raise BadRequest("input is an empty list: give at least one input", "input")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return [list(value)]  # type: ignore[arg-type]
        out = list(value)
        for i, item in enumerate(out):
            if isinstance(item, list) and not item or isinstance(item, str) and not item:
                raise BadRequest(f"input[{i}] is empty", "input")
        return out  # type: ignore[return-value]

    def _truncation(self, req: Any) -> int | None:
        """How many tokens ``truncate_prompt_tokens`` keeps of each prompt (``-1``:
        ``max_model_len``; ``None``: no truncation).

        Raises:
            BadRequest: 0, or more than ``max_model_len`` (as vLLM refuses it), naming it.
        """
        keep = req.truncate_prompt_tokens
        if keep is None:
            return None
        if not (keep == -1 or 0 < keep <= self.max_model_len):
            raise BadRequest(f"truncate_prompt_tokens={keep} must be between 1 and max_model_len = "
                             f"{self.max_model_len} (or -1: max_model_len)", "truncate_prompt_tokens")
        return self.max_model_len if keep == -1 else keep

    def _tokenize(self, items: list[str | list[int]], limit: int | None,
                  add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of every input, cut to ``limit`` tokens (see :meth:`_truncation`);
        texts in one batch call, with the tokenizer's special tokens unless told not to."""
        tok = self.serving.tokenizer
        texts = [(i, t) for i, t in enumerate(items) if isinstance(t, str)]
        out: list[Any] = list(items)
        if texts:
            kwargs: dict[str, Any] = {} if limit is None else {"truncation": True, "max_length": limit}
            kwargs["add_special_tokens"] = add_special_tokens
            enc = tok([t for _, t in texts], **kwargs)["input_ids"]
            for (i, _), ids in zip(texts, enc):
                out[i] = list(ids)
        if limit is not None:
            out = [ids[:limit] for ids in out]
        return out

    async def _pool(self, prompts: list[Any], params: PoolingParams | list[PoolingParams], raw_request: Any,
                    req: Any, prefix: str) -> list[PoolingRequestOutput]:
        """Run every prompt as its own engine request; their outputs, in order."""
        from forkless.engine.async_llm import InvalidRequestError, gather_streams

        from forkless.entrypoints.openai.serving import _request_ids

        # Unique in the engine even when two clients send the same request_id.
        _, base_id = _request_ids(prefix, req.request_id, raw_request)
        client = self.serving_client_key(req, raw_request)
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        order = longest_first(prompts)  # submitted longest first, answered in input order
        for i in order:
            self.serving.log_request(f"{base_id}-{i}", prompts[i], params_list[i])
        try:
            streams = [self.engine.encode(prompts[i], params_list[i], f"{base_id}-{i}", priority=req.priority,
                                          group_id=base_id, client_key=client) for i in order]
        except InvalidRequestError as exc:
            raise BadRequest(str(exc), _refused_param(str(exc))) from None
        await self.engine.send(streams)
        outs = await gather_streams(streams, self._last)  # one failing aborts the others
        result: list[Any] = [None] * len(prompts)
        for i, out in zip(order, outs):
            result[i] = out
        return result

    @staticmethod
    async def _last(stream: AsyncIterator[Any]) -> Any:
        last = None
        async for out in stream:
            last = out
        return last

    @staticmethod
    def serving_client_key(req: Any, raw_request: Any) -> str | None:
        from forkless.entrypoints.openai.serving import _client_key

        return _client_key(req, raw_request)

    async def _prompts(self, req: Any, endpoint: str) -> list[list[int]]:
        """Token ids of each of the request's ``input`` prompts, or of its ``messages``
        rendered by the chat template (one prompt), cut by ``truncate_prompt_tokens``."""
        limit = self._truncation(req)
        if req.messages is not None:
            if req.input is not None:
                raise BadRequest("give either input or messages, not both", "input")
            ids = await self.serving.messages_prompt(req, endpoint)
            return [ids if limit is None else ids[:limit]]
        items = self._input_list(req.input)
        self.serving.check_sequences(len(items), 1, "input")
        for item in items:
            if isinstance(item, str):
                self.serving.check_text_size(len(item), "input")
        return await self.serving.in_tokenizer_thread(self._tokenize, items, limit, req.add_special_tokens)

    @staticmethod
    def _usage(outs: list[PoolingRequestOutput]) -> UsageInfo:
        n = sum(len(o.prompt_token_ids) for o in outs)
        return UsageInfo(prompt_tokens=n, total_tokens=n)

    def _encoded(self, outs: list[PoolingRequestOutput], req: EmbeddingRequest | PoolingRequest, raw_request: Any,
                 prefix: str, response: type[EmbeddingResponse] | type[PoolingResponse],
                 item: Callable[[int, list[Any] | str], Any]) -> EmbeddingResponse | PoolingResponse | Response:
        """The response of pooled values in the request's ``encoding_format``: a JSON list of
        ``item(index, values)``, or the bytes of :func:`_bytes_response`."""
        envelope = {"id": _response_id(prefix, req, raw_request), "created": int(time.time()),
                    "model": self.serving.model_name}
        usage = self._usage(outs)
        if req.encoding_format in ("bytes", "bytes_only"):
            return _bytes_response(outs, req, {**envelope, "usage": usage.model_dump()})
        return response(**envelope, data=[item(i, _encode(o.outputs.data, req)) for i, o in enumerate(outs)],
                        usage=usage)

    # -- endpoints ------------------------------------------------------------------------
    async def create_embedding(self, req: EmbeddingRequest, raw_request: Any) -> EmbeddingResponse | Response:
        await self._accept(req, "/v1/embeddings")
        prompts = await self._prompts(req, "/v1/embeddings")
        params = _params(task="embed", dimensions=req.dimensions, normalize=req.normalize)
        outs = await self._pool(prompts, params, raw_request, req, "embd")
        return self._encoded(outs, req, raw_request, "embd", EmbeddingResponse,
                             lambda i, values: EmbeddingData(index=i, embedding=values))

    async def create_pooling(self, req: PoolingRequest,
                             raw_request: Any) -> PoolingResponse | IOProcessorResponse | Response:
        await self._accept(req, "/pooling")
        if req.data is not None:
            return await self._io_process(req, raw_request)
        prompts = await self._prompts(req, "/pooling")
        params = _params(task=req.task, dimensions=req.dimensions, normalize=req.normalize,
                         use_activation=req.use_activation)
        outs = await self._pool(prompts, params, raw_request, req, "pool")
        return self._encoded(outs, req, raw_request, "pool", PoolingResponse,
                             lambda i, values: PoolingData(index=i, data=values))

    async def _io_process(self, req: PoolingRequest, raw_request: Any) -> IOProcessorResponse:
        proc = self.io_processor
        if proc is None:
            raise BadRequest("this request has a 'data' field, which only an IO processor plugin reads, and the "
                             "server runs none (start it with --io-processor-plugin NAME)", "data")
        if req.task not in (None, "plugin"):  # "plugin": vLLM's default for a data request
            raise BadRequest(f"task={req.task!r} with 'data': the IO processor plugin chooses how its prompts are "
                             "pooled; leave task out (or 'plugin', vLLM's value for it)", "task")
        request_id = req.request_id or random_id("pool")
        try:
            parsed = proc.parse_body(req)
            params = proc.pooling_params()
            prompts = await proc.pre_process_async(parsed, request_id)
        except ValueError as exc:
            raise BadRequest(f"IO processor: {exc}", "data") from None
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            raise BadRequest("IO processor: the data made no prompts to pool", "data")
        texts = [(i, p) for i, p in enumerate(prompts) if isinstance(p, str)]
        if texts:
            ids = await self.serving.in_tokenizer_thread(self._tokenize, [p for _, p in texts], None)
            for (i, _), t in zip(texts, ids):
                prompts[i] = t
        outs = await self._pool(prompts, params, raw_request, req, "pool")

        async def pairs() -> AsyncIterator[tuple[int, PoolingRequestOutput]]:
            for i, out in enumerate(outs):
                yield i, out

        try:
            result = await proc.post_process_async(pairs(), request_id)
            body = proc.response_data(result)
        except ValueError as exc:
            raise BadRequest(f"IO processor: {exc}", "data") from None
        if isinstance(body, IOProcessorResponse):  # a plugin that made the whole response (vLLM's earlier API)
            return body.model_copy(update={"request_id": body.request_id or request_id})
        return IOProcessorResponse(request_id=request_id, data=body)

    def _label(self, index: int) -> str | None:
        """The class name of ``index`` (``config.json``'s ``id2label``; ``LABEL_i`` without one)."""
        if self._labels is None:
            import json
            from pathlib import Path

            hf = json.loads((Path(self.engine.processor.config.model_config.model) / "config.json").read_text())
            self._labels = {int(k): v for k, v in (hf.get("id2label") or {}).items()}
        return self._labels.get(index, f"LABEL_{index}")

    def refuse_generation(self, endpoint: str) -> None:
        """A pooling model has no completions: a 400 naming the endpoints it has.

        Raises:
            BadRequest: When the served model is a pooling model.
        """
        if self.pooler is not None:
            raise BadRequest(f"{endpoint}: {self.serving.model_name} is a pooling model (--runner pooling): it makes "
                             "embeddings, classifications and scores, not text; use /v1/embeddings, /pooling, "
                             "/classify, /score or /rerank", "model")

    async def create_classify(self, req: ClassificationRequest, raw_request: Any) -> ClassificationResponse:
        await self._accept(req, "/classify")
        prompts = await self._prompts(req, "/classify")
        params = _params(task="classify", use_activation=req.use_activation)
        outs = await self._pool(prompts, params, raw_request, req, "classify")
        data = []
        for i, o in enumerate(outs):
            probs = o.outputs.data.reshape(-1)
            data.append(ClassificationData(index=i, label=self._label(int(np.argmax(probs))), probs=probs.tolist(),
                                           num_classes=len(probs)))
        return ClassificationResponse(id=_response_id("classify", req, raw_request), created=int(time.time()),
                                      model=self.serving.model_name, data=data, usage=self._usage(outs))

    async def _scores(self, left: list[str], right: list[str], req: Any, raw_request: Any,
                      prefix: str, right_param: str) -> tuple[list[float], int]:
        """Relevance of each (left, right) pair, and the prompt tokens used (``right_param``:
        the request's field of ``right``, for errors)."""
        pooler = self.pooler
        assert pooler is not None
        if "score" not in pooler.tasks:
            raise BadRequest(f"{self.serving.model_name} cannot score pairs: it needs a cross-encoder (a classifier "
                             "with one label) or an embedding model", "model")
        if len(left) == 1:
            left = left * len(right)
        if not right or len(left) != len(right):
            raise BadRequest(f"{len(left)} texts to pair with {len(right)}: give one text and a list, or two lists "
                             "of the same (non-zero) length", right_param)
        self.serving.check_sequences(len(right), 1, right_param)
        limit = self._truncation(req)
        if pooler.task == "classify":  # a cross-encoder reads each pair at once
            processor = self.engine.processor

            def pairs() -> list[dict[str, Any]]:
                return [processor.tokenize_pair(a, b, limit) for a, b in zip(left, right)]

            prompts = await self.serving.in_tokenizer_thread(pairs)
            params = PoolingParams(task="score", use_activation=req.use_activation)
            outs = await self._pool(prompts, params, raw_request, req, prefix)
            return [float(o.outputs.data.reshape(-1)[0]) for o in outs], sum(len(o.prompt_token_ids) for o in outs)
        texts = list(dict.fromkeys([*left, *right]))
        ids = await self.serving.in_tokenizer_thread(self._tokenize, texts, limit)
        outs = await self._pool(ids, PoolingParams(task="embed"), raw_request, req, prefix)
        vec = {t: o.outputs.data.astype(np.float64) for t, o in zip(texts, outs)}
        scores = [float(vec[a] @ vec[b] / max(np.linalg.norm(vec[a]) * np.linalg.norm(vec[b]), 1e-12))
                  for a, b in zip(left, right)]
        return scores, sum(len(o.prompt_token_ids) for o in outs)

    @staticmethod
    def _texts(req: Any, names: tuple[str, ...]) -> tuple[list[str], str]:
        """The texts of the first of ``names`` the request gives, and that name."""
        param = next((name for name in names if getattr(req, name) is not None), names[0])
        value = getattr(req, param)
        if value is None:
            raise BadRequest(f"{param} is required", param)
        items = [value] if isinstance(value, str) else list(value)
        if not items:
            raise BadRequest(f"{param} is an empty list", param)
        return items, param

    async def create_score(self, req: ScoreRequest, raw_request: Any) -> ScoreResponse:
        await self._accept(req, "/score")
        left, _ = self._texts(req, ("text_1", "queries", "data_1"))
        right, right_param = self._texts(req, ("text_2", "documents", "items", "data_2"))
        scores, tokens = await self._scores(left, right, req, raw_request, "score", right_param)
        return ScoreResponse(id=_response_id("score", req, raw_request), created=int(time.time()),
                             model=self.serving.model_name,
                             data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)],
                             usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens))

    async def create_rerank(self, req: RerankRequest, raw_request: Any) -> RerankResponse:
        await self._accept(req, "/rerank")
        documents, _ = self._texts(req, ("documents",))
        scores, tokens = await self._scores([req.query], documents, req, raw_request, "rerank", "documents")
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        if req.top_n:
            order = order[: req.top_n]
        results = [RerankResult(index=i, relevance_score=scores[i],
                                document=RerankDocument(text=documents[i]) if req.return_documents else None)
                   for i in order]
        return RerankResponse(id=_response_id("rerank", req, raw_request), model=self.serving.model_name,
                              usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens), results=results)


def attach_pooling_routes(app: FastAPI, engine: AsyncLLM, serving: OpenAIServing,
                          io_processor: IOProcessor | None, run: Any,
                          ) -> tuple[OpenAIServingPooling, Callable[[], list[tuple[str, tuple[str, ...], type, Any]]]]:
    """Add the pooling routes to ``app``.

    Args:
        app: The server's app.
        engine: The engine.
        serving: The completions serving object.
        io_processor: The ``--io-processor-plugin`` processor, or ``None``.
        run: ``run(request, awaitable)`` -> the result, cancelled when the client goes away.

    Returns:
        The serving object behind the routes, and a function giving the routes a body sent
        to ``/invocations`` may be served by for the model's tasks, in vLLM's order: (what
        the body is, the keys one of which such a body has, its request type,
        ``endpoint(req, request)``).
    """
    pooling = OpenAIServingPooling(engine, serving, io_processor)

    def respond(result: Any) -> Response:
        if isinstance(result, Response):  # the bytes encodings
            return result
        return JSONResponse(result.model_dump(exclude_none=isinstance(result, RerankResponse)))

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, request: Request) -> Response:
        return respond(await run(request, pooling.create_embedding(req, request)))

    async def pool(req: PoolingRequest, request: Request) -> Response:
        return respond(await run(request, pooling.create_pooling(req, request)))

    async def classify(req: ClassificationRequest, request: Request) -> JSONResponse:
        return respond(await run(request, pooling.create_classify(req, request)))

    async def score(req: ScoreRequest, request: Request) -> JSONResponse:
        return respond(await run(request, pooling.create_score(req, request)))

    async def rerank(req: RerankRequest, request: Request) -> JSONResponse:
        return respond(await run(request, pooling.create_rerank(req, request)))

    for path, endpoint in (("/pooling", pool), ("/classify", classify), ("/score", score), ("/rerank", rerank)):
        app.add_api_route(path, endpoint, methods=["POST"])
        app.add_api_route("/v1" + path, endpoint, methods=["POST"])
    app.add_api_route("/v2/rerank", rerank, methods=["POST"])

    def invocation_routes() -> list[tuple[str, tuple[str, ...], type, Any]]:
        tasks = pooling.pooler.tasks
        routes = [("an embedding request", ("input", "messages"), EmbeddingRequest, embeddings, "embed"),
                  ("a classification request", ("input", "messages"), ClassificationRequest, classify, "classify"),
                  ("a score request", ("text_1", "queries", "data_1"), ScoreRequest, score, "score"),
                  ("a rerank request", ("query",), RerankRequest, rerank, "score"),
                  ("a pooling request", ("input", "messages", "data"), PoolingRequest, pool, None)]
        return [(name, keys, kind, endpoint) for name, keys, kind, endpoint, task in routes
                if task is None or task in tasks]

    return pooling, invocation_routes
