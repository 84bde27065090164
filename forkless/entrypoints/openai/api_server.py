"""The FastAPI application of ``forkless serve``.

Routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/responses``, the pooling routes,
``/v1/models``, ``/health`` (and vLLM's SageMaker probe ``/ping``), ``/version``, ``/tokenize``,
``/detokenize``, ``/metrics``, vLLM's SageMaker ``/invocations`` (a body served by the route
its keys belong to), FastAPI's ``/docs``, ``/redoc`` and ``/openapi.json``;
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` with ``--enable-lora`` and
``FORKLESS_ALLOW_RUNTIME_LORA_UPDATING=1``; vLLM's development routes ``/reset_prefix_cache``,
``/sleep``, ``/wake_up``, ``/is_sleeping``, ``/pause``, ``/resume``, ``/is_paused`` and ``/abort_requests`` with
``FORKLESS_SERVER_DEV_MODE=1``; plus routes
from opt-in endpoint plugins and ASGI middleware from ``--middleware``.

Invariants:
    * ``/health`` is 200 while the server takes requests; a 503 with the OpenAI error body
      once the engine is dead or a shutdown has begun (``app.state.shutting_down``).
    * Every error answer has the OpenAI body (``errors.py``): the application's own,
      FastAPI's (unknown route, wrong method, unparsable body) and the HTTP limits'.
    * An unexpected exception is a 500 that leaves the connection usable, unless the
      response had already started.
    * Middleware, outermost first: ``--middleware`` (in the order given, the last one
      outermost), the API key check, the HTTP limits (``http_limits.py``), the 500 guard;
      then the routes, endpoint plugins' included. So with ``--api-key`` every route but
      ``/health``, ``/ping``, ``/version`` and ``/metrics`` needs the key, whoever added it.
    * When the server stops, the Responses API's background responses still running are
      cancelled (stored ``cancelled``, their engine requests aborted) before the engine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from forkless.engine.async_llm import EngineDeadError, InvalidRequestError, RequestFailedError
from forkless.entrypoints.openai.chat_options import ChatOptions
from forkless import envs
from forkless.entrypoints.openai.dev_routes import attach_dev_routes
from forkless.entrypoints.openai.errors import BadRequest, describe_validation_errors, error_response, quoted
from forkless.entrypoints.openai.frontend_options import FrontendOptions
from forkless.entrypoints.openai.http_limits import ApiKeyMiddleware, HttpLimits, RequestLimitsMiddleware
from forkless.protocol.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    LoadLoRAAdapterRequest,
    ModelList,
    ResponsesRequest,
    TokenizeRequest,
    TokenizeResponse,
    UnloadLoRAAdapterRequest,
)
from forkless.entrypoints.openai.server_load import ServerLoad, ServerLoadMiddleware
from forkless.entrypoints.openai.serving import OpenAIServing, check_unknown_fields
from forkless.entrypoints.openai.serving_models import LoRAModulePath, ServingModels
from forkless.entrypoints.openai.serving_pooling import attach_pooling_routes
from forkless.entrypoints.openai.serving_responses import OpenAIServingResponses
from forkless.logger import init_logger
from forkless.plugins import DEPRECATIONS, ENDPOINT_PLUGINS_GROUP, DeprecatedError, call_plugins_by_group, import_path
from forkless.version import __version__

if TYPE_CHECKING:
    from forkless.engine.async_llm import AsyncLLM

logger = init_logger("forkless.entrypoints.openai")


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


class InternalErrorMiddleware:
    """Answers an unexpected exception with a 500 and an OpenAI error body, logged with
    its traceback. Starlette's own error middleware re-raises after answering, and uvicorn
    then drops the connection; here it stays open for the client's next request. Once
    the response has started the exception goes on up: that response is broken.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except ClientDisconnect:
            pass  # nobody to answer
        except Exception as exc:
            if started:
                raise
            logger.error("unhandled error in %s %s", scope["method"], quoted(scope["path"]), exc_info=exc)
            response = error_response(f"internal error: {type(exc).__name__}: {exc}", 500, "InternalServerError")
            await response(scope, receive, send)


def _http_error_message(request: Request, exc: HTTPException) -> str:
    """What FastAPI's and Starlette's own HTTP errors say, in words a client can act on."""
    path = quoted(request.url.path)
    if exc.status_code == 404 and exc.detail == "Not Found":
        return f"Not Found: there is no route {request.method} {path}"
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow") or (exc.headers or {}).get("allow")
        return f"Method Not Allowed: {request.method} {path}" + (f" (allowed: {allowed})" if allowed else "")
    if isinstance(exc.__cause__, UnicodeDecodeError):
        return f"the request body is not valid UTF-8: {exc.__cause__.reason} at byte {exc.__cause__.start}"
    if isinstance(exc.__cause__, RecursionError):
        return "the request body is not valid JSON: it is nested too deeply to parse"
    return str(exc.detail)


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
    try:
        # What Starlette will do with it: a class gets the app, a function the request
        # and the next handler; a wrong signature would otherwise fail every request.
        inspect.signature(obj).bind(*(("app",) if inspect.isclass(obj) else ("request", "call_next")))
    except TypeError as exc:
        expected = "a class taking the ASGI app" if inspect.isclass(obj) else "an async function (request, call_next)"
        raise TypeError(f"{path!r} cannot be called as {expected}: {exc}") from None
    except ValueError:
        pass  # no signature to read: Starlette will tell
    return obj


def _add_middleware(app: FastAPI, path: str) -> None:
    obj = resolve_middleware(path)
    if inspect.isclass(obj):
        app.add_middleware(obj)
    else:
        app.middleware("http")(obj)


def _plugin_origin(group: str, name: str) -> str:
    """``'name' (distribution DIST VERSION)``: which installed package a plugin came from."""
    from forkless.plugins import plugin_records

    for record in plugin_records():
        if record.group == group and record.name == name:
            return f"{name!r} (distribution {record.dist} {record.version})"
    return repr(name)


def _attach_endpoint_plugins(app: FastAPI) -> None:
    """Add the routes of the endpoint plugins the operator opted in to (``FORKLESS_PLUGINS``).

    The server does not start without them: a factory that fails, an ``attach_router`` that
    raises, or a factory's result without one is an error naming the plugin (opted in by
    name, they are not skipped as other failing plugins are). A route a plugin adds that a
    route before it already answers (same path and method) would never be served: said.
    """
    from forkless.plugins import plugin_records

    plugins = call_plugins_by_group(ENDPOINT_PLUGINS_GROUP)
    failed = [r for r in plugin_records() if r.group == ENDPOINT_PLUGINS_GROUP and r.status == "failed"]
    if failed:
        raise RuntimeError("; ".join(f"endpoint plugin {_plugin_origin(ENDPOINT_PLUGINS_GROUP, r.name)} failed: "
                                     f"{r.error}" for r in failed))
    for name, plugin in plugins.items():
        origin = _plugin_origin(ENDPOINT_PLUGINS_GROUP, name)
        if not hasattr(plugin, "attach_router"):  # the object a third-party factory returned
            raise RuntimeError(f"endpoint plugin {origin} returned {plugin!r:.200}, which has no attach_router(app)")
        before = len(app.router.routes)
        taken = {(getattr(r, "path", None), m) for r in app.router.routes for m in getattr(r, "methods", None) or ()}
        try:
            plugin.attach_router(app)
        except Exception as exc:
            raise RuntimeError(f"endpoint plugin {origin}: attach_router(app) raised {type(exc).__name__}: "
                               f"{exc}") from exc
        shadowed = sorted(f"{m} {r.path}" for r in app.router.routes[before:] for m in getattr(r, "methods", None) or ()
                          if (getattr(r, "path", None), m) in taken)
        if shadowed:
            logger.warning("endpoint plugin %s: its route(s) %s are never served: forkless (or a plugin before "
                           "it) answers them first", origin, ", ".join(shadowed))
        logger.info("endpoint plugin %r attached its routes", name)


def build_app(engine: "AsyncLLM", served_model_names: list[str], max_model_len: int,
              api_key: str | None = None, middleware: list[str] | None = None,
              metrics: Callable[[], bytes] | None = None,
              chat_options: ChatOptions | None = None, limits: HttpLimits | None = None,
              lora_modules: list[LoRAModulePath] | None = None, io_processor: Any = None,
              log_requests: bool = False, frontend: FrontendOptions | None = None,
              enable_prompt_tokens_details: bool = False, return_tokens_as_token_ids: bool = False,
              enable_force_include_usage: bool = False) -> FastAPI:
    """Assemble the FastAPI app around a running engine.

    Args:
        engine: The async engine the routes submit to.
        served_model_names: Names accepted in the ``model`` field; the first is reported.
        max_model_len: Context length, for validation and ``/v1/models``.
        api_key: When set, every route but ``/health``, ``/ping``, ``/version`` and ``/metrics``
            requires ``Authorization: Bearer <key>``.
        middleware: Class paths (or async functions) of ASGI middleware to add.
        metrics: Returns the Prometheus exposition text for ``/metrics``.
        chat_options: Chat template override and tool/reasoning parsers.
        limits: Request body size and read timeout, sequences per request.
        lora_modules: ``--lora-modules`` adapters, served under their names (needs
            ``--enable-lora``).
        io_processor: The ``--io-processor-plugin`` processor for ``/pooling`` ``data``.
        log_requests: Log one line per engine request (``--enable-log-requests``).
        frontend: CORS and the docs pages (``--allowed-origins``, ``--disable-fastapi-docs``...).
        enable_prompt_tokens_details: Completions and chat report
            ``usage.prompt_tokens_details.cached_tokens`` (``--enable-prompt-tokens-details``).
        return_tokens_as_token_ids: Logprobs name tokens ``"token_id:N"`` unless a request
            says otherwise (``--return-tokens-as-token-ids``).
        enable_force_include_usage: Every stream ends with its usage, as if it asked for
            ``stream_options.include_usage`` (``--enable-force-include-usage``).

    Raises:
        ValueError: A ``--lora-modules`` adapter cannot be served (the message names it).
    """
    limits = limits or HttpLimits()
    frontend = frontend or FrontendOptions()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        # The server is stopping (after its drain): background responses have no
        # connection to wait for; each is cancelled and its engine request aborted.
        await responses.shutdown()

    app = FastAPI(title="forkless", version=__version__, lifespan=lifespan, **frontend.fastapi_options())
    server_load = ServerLoad()
    models = ServingModels(engine, served_model_names, max_model_len)
    models.load_static(lora_modules or [])
    serving = OpenAIServing(engine, served_model_names, max_model_len, chat_options,
                            max_sequences_per_request=limits.max_sequences_per_request, models=models,
                            log_requests=log_requests, enable_prompt_tokens_details=enable_prompt_tokens_details,
                            return_tokens_as_token_ids=return_tokens_as_token_ids,
                            enable_force_include_usage=enable_force_include_usage)
    app.state.serving = serving
    app.state.engine = engine
    engine.log_requests = log_requests  # aborts are logged too, as vLLM's
    # Set by forkless serve when a signal starts its draining shutdown: /health is a 503 then.
    app.state.shutting_down = False

    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, exc: BadRequest) -> JSONResponse:
        return error_response(exc.message, exc.status, exc.err_type, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_errors(exc.errors(), exc.body)
        in_body = any(tuple(e.get("loc", ()))[:1] == ("body",) for e in exc.errors())
        if in_body and "json" not in request.headers.get("content-type", ""):
            # FastAPI reads a body without a JSON content type as bytes, not as JSON.
            message += " (send the body as JSON, with Content-Type: application/json)"
        return error_response(message, 400, "BadRequestError", param)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code in (204, 304):  # no body allowed
            return Response(status_code=exc.status_code, headers=exc.headers)
        return error_response(_http_error_message(request, exc), exc.status_code, headers=exc.headers)

    @app.exception_handler(DeprecatedError)
    async def _deprecated(_: Request, exc: DeprecatedError) -> JSONResponse:
        return error_response(str(exc), 400, "BadRequestError")

    @app.exception_handler(InvalidRequestError)
    async def _rejected(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return error_response(str(exc), 400, "BadRequestError")

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(str(exc), 503, "ServiceUnavailableError")

    @app.exception_handler(RequestFailedError)
    async def _failed(_: Request, exc: RequestFailedError) -> JSONResponse:
        # One request failed in the engine (which logged why); no traceback here.
        return error_response(str(exc), exc.status)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logger.error("unhandled error: %s", exc, exc_info=exc)
        return error_response(f"internal error: {type(exc).__name__}: {exc}", 500, "InternalServerError")

    def check_deprecated(request: Request, body: Any) -> None:
        DEPRECATIONS.check_http_fields(request.url.path, body.model_dump(exclude_unset=True))

    def respond(result: Any) -> Response:
        if isinstance(result, Response):
            return result
        if inspect.isasyncgen(result):
            return StreamingResponse(result, media_type="text/event-stream")
        return JSONResponse(result.model_dump())

    @app.get("/health")
    @app.api_route("/ping", methods=["GET", "POST"])  # vLLM's SageMaker probe: /health's answer
    async def health() -> Response:
        if engine.errored:
            return error_response(f"engine is dead: {engine.dead_reason}", 503, "ServiceUnavailableError")
        if app.state.shutting_down:
            return error_response("server is shutting down: it accepts no new requests and is finishing "
                                  "those in flight (--shutdown-timeout)", 503, "ServiceUnavailableError")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/load")
    async def load() -> dict[str, int]:
        # vLLM's: requests in flight on the routes that run the engine (server_load.py).
        return {"server_load": server_load.in_flight}

    @app.get("/v1/models")
    async def list_models() -> ModelList:
        return ModelList(data=models.model_cards())

    if models.runtime_updating:
        # vLLM's routes and answers; only with FORKLESS_ALLOW_RUNTIME_LORA_UPDATING=1.
        @app.post("/v1/load_lora_adapter")
        async def load_lora_adapter(req: LoadLoRAAdapterRequest) -> Response:
            check_unknown_fields(req)  # (vLLM's lora_int_id is the server's to choose here)
            await models.add_lora(req.lora_name, req.lora_path, load_inplace=req.load_inplace)
            return Response(f"Success: LoRA adapter '{req.lora_name}' added successfully.", media_type="text/plain")

        @app.post("/v1/unload_lora_adapter")
        async def unload_lora_adapter(req: UnloadLoRAAdapterRequest) -> Response:
            check_unknown_fields(req)
            models.remove_lora(req.lora_name, req.lora_int_id)
            return Response(f"Success: LoRA adapter '{req.lora_name}' removed successfully.", media_type="text/plain")

    if envs.FORKLESS_SERVER_DEV_MODE:
        attach_dev_routes(app, engine)

    pooling, pooling_invocations = attach_pooling_routes(app, engine, serving, io_processor, _cancel_on_disconnect)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        check_deprecated(request, req)
        pooling.refuse_generation("/v1/completions")
        return respond(await _cancel_on_disconnect(request, serving.create_completion(req, request)))

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request) -> Response:
        check_deprecated(request, req)
        pooling.refuse_generation("/v1/chat/completions")
        return respond(await _cancel_on_disconnect(request, serving.create_chat_completion(req, request)))

    responses = OpenAIServingResponses(serving)
    # (forkless serve's drain waits for its background responses, then cancels them.)
    app.state.responses = responses

    @app.post("/v1/responses")
    async def create_response(req: ResponsesRequest, request: Request) -> Response:
        check_deprecated(request, req)
        pooling.refuse_generation("/v1/responses")
        result = await _cancel_on_disconnect(request, responses.create(req, request))
        return JSONResponse(result) if isinstance(result, dict) else respond(result)

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str, request: Request) -> Response:
        result = responses.retrieve(response_id, dict(request.query_params))
        return JSONResponse(result) if isinstance(result, dict) else respond(result)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> JSONResponse:
        return JSONResponse(await responses.delete(response_id))

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> JSONResponse:
        return JSONResponse(await responses.cancel(response_id))

    @app.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(response_id: str) -> JSONResponse:
        return JSONResponse(responses.input_items(response_id))

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest, request: Request) -> TokenizeResponse:
        check_deprecated(request, req)
        return await serving.tokenize(req)

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest, request: Request) -> DetokenizeResponse:
        check_deprecated(request, req)
        return await serving.detokenize(req)

    @app.post("/invocations")
    async def invocations(request: Request) -> Response:
        # vLLM's SageMaker route: the body goes to the first route, in vLLM's order, whose
        # request it is (a generative model's chat then completions; a pooling model's
        # routes for its tasks), told by the keys that route's request needs.
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            raise BadRequest(f"the body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
        routes = (pooling_invocations() if pooling.pooler is not None else
                  [("a chat completion request", ("messages",), ChatCompletionRequest, chat),
                   ("a completion request", ("prompt",), CompletionRequest, completions)])
        for _, keys, kind, endpoint in routes:
            if any(key in body for key in keys):
                try:
                    req = kind.model_validate(body)
                except ValidationError as exc:
                    raise RequestValidationError(exc.errors(), body=body) from None
                return await endpoint(req, request)
        raise BadRequest("/invocations: the body is none of what this model serves: "
                         + ", ".join(f"{name} (with {' or '.join(keys)})" for name, keys, _, _ in routes))

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        body = metrics() if metrics is not None else b""
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    _attach_endpoint_plugins(app)
    # Added innermost first (each add_middleware wraps what is there), after the plugins,
    # so that middleware a plugin adds is inside the key check too.
    app.add_middleware(InternalErrorMiddleware)
    app.add_middleware(ServerLoadMiddleware, tracker=server_load)
    app.add_middleware(RequestLimitsMiddleware, limits=limits)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    for path in middleware or []:
        _add_middleware(app, path)
    frontend.add_middleware(app)
    return app
