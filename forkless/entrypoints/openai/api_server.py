"""The FastAPI application of ``forkless serve``.

Routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``,
``/version``, ``/tokenize``, ``/detokenize``, ``/metrics``; plus routes from opt-in
endpoint plugins and ASGI middleware from ``--middleware``.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from forkless.engine.async_llm import EngineDeadError, InvalidRequestError
from forkless.entrypoints.openai.chat_options import ChatOptions
from forkless.entrypoints.openai.errors import BadRequest, error_response
from forkless.protocol.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from forkless.entrypoints.openai.serving import OpenAIServing
from forkless.logger import init_logger
from forkless.plugins import DEPRECATIONS, ENDPOINT_PLUGINS_GROUP, DeprecatedError, call_plugin, import_path, load_plugins_by_group
from forkless.version import __version__

if TYPE_CHECKING:
    from forkless.engine.async_llm import AsyncLLM

logger = init_logger("forkless.entrypoints.openai")

# Routes that --api-key protects; health, version and metrics stay open for probes.
_PROTECTED_PREFIXES = ("/v1", "/tokenize", "/detokenize")


async def _cancel_on_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Run ``work``; if the client disconnects first, cancel it (which aborts its requests)."""
    task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(wait_disconnect())
    done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return Response(status_code=499)


def resolve_middleware(path: str) -> Any:
    """Import a ``--middleware`` value and check that it is usable as middleware.

    Raises:
        ValueError, ImportError, TypeError: The path is malformed, does not import, or
            names neither an ASGI middleware class nor an async function.
    """
    obj = import_path(path)
    if not (inspect.isclass(obj) or inspect.iscoroutinefunction(obj)):
        raise TypeError(f"{path!r} is {obj!r}: expected an ASGI middleware class or an "
                        "async function (request, call_next)")
    return obj


def _add_middleware(app: FastAPI, path: str) -> None:
    obj = resolve_middleware(path)
    if inspect.isclass(obj):
        app.add_middleware(obj)
    else:
        app.middleware("http")(obj)


def build_app(engine: "AsyncLLM", served_model_names: list[str], max_model_len: int,
              api_key: str | None = None, middleware: list[str] | None = None,
              metrics: Callable[[], bytes] | None = None,
              chat_options: ChatOptions | None = None) -> FastAPI:
    """Assemble the FastAPI app around a running engine.

    Args:
        engine: The async engine the routes submit to.
        served_model_names: Names accepted in the ``model`` field; the first is reported.
        max_model_len: Context length, for validation and ``/v1/models``.
        api_key: When set, protected routes require ``Authorization: Bearer <key>``.
        middleware: Class paths (or async functions) of ASGI middleware to add.
        metrics: Returns the Prometheus exposition text for ``/metrics``.
        chat_options: Chat template override and tool/reasoning parsers.
    """
    app = FastAPI(title="forkless", version=__version__)
    serving = OpenAIServing(engine, served_model_names, max_model_len, chat_options)
    app.state.serving = serving
    app.state.engine = engine

    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, exc: BadRequest) -> JSONResponse:
        return error_response(exc.message, exc.status, exc.err_type, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            message = f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}"
        else:
            message = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
                                for e in errors) or "invalid request"
        return error_response(message, 400, "BadRequestError", ".".join(loc) or None)

    @app.exception_handler(DeprecatedError)
    async def _deprecated(_: Request, exc: DeprecatedError) -> JSONResponse:
        return error_response(str(exc), 400, "BadRequestError")

    @app.exception_handler(InvalidRequestError)
    async def _rejected(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return error_response(str(exc), 400, "BadRequestError")

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(str(exc), 503, "ServiceUnavailableError")

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logger.error("unhandled error: %s", exc, exc_info=exc)
        return error_response(f"internal error: {type(exc).__name__}: {exc}", 500, "InternalServerError")

    if api_key:
        @app.middleware("http")
        async def _authenticate(request: Request, call_next: Any) -> Response:
            if request.method != "OPTIONS" and request.url.path.startswith(_PROTECTED_PREFIXES):
                if request.headers.get("Authorization") != f"Bearer {api_key}":
                    return error_response("invalid or missing API key (send Authorization: Bearer <key>)",
                                          401, "AuthenticationError")
            return await call_next(request)

    def check_deprecated(request: Request, body: Any) -> None:
        DEPRECATIONS.check_http_fields(request.url.path, body.model_dump(exclude_unset=True))

    def respond(result: Any) -> Response:
        if isinstance(result, Response):
            return result
        if inspect.isasyncgen(result):
            return StreamingResponse(result, media_type="text/event-stream")
        return JSONResponse(result.model_dump())

    @app.get("/health")
    async def health() -> Response:
        if engine.errored:
            return error_response(f"engine is dead: {engine.dead_reason}", 503, "ServiceUnavailableError")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/v1/models")
    async def models() -> ModelList:
        root = str(engine.model_path)
        return ModelList(data=[ModelCard(id=n, root=root, max_model_len=max_model_len) for n in served_model_names])

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        check_deprecated(request, req)
        return respond(await _cancel_on_disconnect(request, serving.create_completion(req, request)))

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request) -> Response:
        check_deprecated(request, req)
        return respond(await _cancel_on_disconnect(request, serving.create_chat_completion(req, request)))

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest, request: Request) -> TokenizeResponse:
        check_deprecated(request, req)
        serving.check_model(req.model)
        if req.messages is not None:
            tokens = serving.render_chat(ChatCompletionRequest(messages=req.messages, add_generation_prompt=req.add_generation_prompt))
        elif req.prompt is not None:
            tokens = engine.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            raise BadRequest("give either prompt or messages", "prompt")
        return TokenizeResponse(count=len(tokens), max_model_len=max_model_len, tokens=list(tokens))

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest, request: Request) -> DetokenizeResponse:
        check_deprecated(request, req)
        serving.check_model(req.model)
        vocab = len(engine.tokenizer)
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"token ids out of range [0, {vocab}): {bad[:5]}", "tokens")
        return DetokenizeResponse(prompt=engine.tokenizer.decode(req.tokens))

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        body = metrics() if metrics is not None else b""
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    for name, factory in load_plugins_by_group(ENDPOINT_PLUGINS_GROUP).items():
        ok, plugin = call_plugin(ENDPOINT_PLUGINS_GROUP, name, factory)
        if ok and hasattr(plugin, "attach_router"):
            plugin.attach_router(app)
            logger.info("endpoint plugin %r attached its routes", name)
        elif ok:
            logger.warning("endpoint plugin %r returned %r, which has no attach_router(app)", name, plugin)
    for path in middleware or []:
        _add_middleware(app, path)
    return app
