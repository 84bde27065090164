"""``forkless serve [MODEL]``: the OpenAI-compatible server.

Three kinds of process: this one (API server: FastAPI + uvicorn, tokenizer, stat
loggers), the engine core (scheduler, KV cache, executor) and the workers (model). The
engine core and workers are spawned; each loads the general plugins itself.

Lifecycle invariants:
    * The listening socket is bound first, before the engine starts: a busy port fails in
      about a second with one line, instead of after loading the model. The socket is
      handed to uvicorn, which serves on it once the engine is ready.
    * SIGTERM or SIGINT drains: no new connection is accepted and no new request admitted
      (503), the requests in flight run on for ``--shutdown-timeout`` seconds, and those
      still unfinished then end with an OpenAI error (a JSON 503, or an SSE error event
      and ``data: [DONE]`` on a stream) before the engine is stopped; the Responses API's
      background responses get the same time, then are cancelled. The process exits
      0, without tracebacks. A second signal skips the rest of the wait.
    * What a load balancer sees from the signal on: a new connection is refused (it carried
      no request, so a balancer can safely retry it on another server), an idle keep-alive connection is
      closed, and a ``/health`` already read on an open connection, or answered in the
      moment before the listener closes, is a 503 ("server is shutting down"), never 200.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import json
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import uvicorn

from forkless import envs
from forkless.entrypoints.cli.arg_types import port_number
from forkless.entrypoints.cli.main import STARTED
from forkless.entrypoints.openai.frontend_options import FrontendOptions
from forkless.entrypoints.openai.frontend_options import add_cli_args as add_frontend_args
from forkless.gc_tuning import tune_process
from forkless.logger import init_logger

logger = init_logger("forkless.serve")

# vLLM's default: on SIGTERM the requests in flight end at once (with an error).
DEFAULT_SHUTDOWN_TIMEOUT = 0.0
# After the shutdown timeout, how long the ended requests have to deliver their errors,
# and then how long uvicorn waits for any other connection before cancelling it.
_ERROR_DELIVERY_S = 5.0
_FORCE_CLOSE_AFTER_S = 5.0
_LISTEN_BACKLOG = 2048  # uvicorn's default


def _non_negative_seconds(value: str) -> float:
    """argparse type of ``--shutdown-timeout``: seconds, 0 or more."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds >= 0:  # nan compares false too
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {value!r}")
    return seconds


# vLLM's serve flags that ask for something forkless does not do: refused with the reason
# (rather than argparse's bare "unrecognized arguments").
_REFUSED_FLAGS = {
    "--uds": "listening on a Unix domain socket is not supported: use --host and --port",
    "--disable-frontend-multiprocessing": "the engine always runs in its own process, apart from the API server",
    "--download-dir": "nothing is downloaded: models load from local folders (or the embedded default model)",
    "--hf-overrides": "config overrides are not supported: edit a copy of the model folder's config.json",
}


def add_parser(subparsers: Any) -> None:
    from forkless.config import EngineArgs

    parser = subparsers.add_parser(
        "serve", help="serve a model over the OpenAI API (default: the embedded SmolLM2-135M-Instruct)")
    EngineArgs.add_cli_args(parser, model_positional=True)
    parser.add_argument("--config", metavar="YAML",
                        help="read flags from a YAML file (max-model-len: 4096, ...); flags on the command "
                             "line win")
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    group.add_argument("--port", type=port_number, default=8000, help="port to listen on (default 8000)")
    group.add_argument("--api-key", default=envs.FORKLESS_API_KEY,
                       help="require 'Authorization: Bearer KEY' on every route but /health, /ping, /version "
                            "and /metrics (or FORKLESS_API_KEY)")
    # Defaults (None) are HttpLimits' (forkless/entrypoints/openai/http_limits.py), which
    # also checks the values; it is not imported here, to keep the first log line fast.
    group.add_argument("--max-request-body-size", type=int, default=None, metavar="BYTES",
                       help="refuse larger request bodies with 413 (default 33554432, 32 MiB)")
    group.add_argument("--request-read-timeout", type=float, default=None, metavar="SECONDS",
                       help="seconds a client has to send a request's headers (else the connection is "
                            "closed), and again its body (else 408) (default 30)")
    group.add_argument("--max-sequences-per-request", type=int, default=None, metavar="N",
                       help="refuse requests asking for more sequences (prompts × n) with 400 (default 256)")
    group.add_argument("--uvicorn-log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug", "trace"])
    add_frontend_args(group)
    logs = group.add_mutually_exclusive_group()
    logs.add_argument("--enable-log-requests", action="store_true",
                      help="log one line per request: its id, prompt length and sampling parameters")
    logs.add_argument("--disable-log-requests", action="store_true",
                      help="no per-request lines: the default (accepted for vLLM's command lines)")
    group.add_argument("--enable-prompt-tokens-details", action="store_true",
                       help="completions and chat report usage.prompt_tokens_details.cached_tokens, the prompt "
                            "tokens found in the prefix cache (as vLLM: only when there are some)")
    group.add_argument("--enable-force-include-usage", action="store_true",
                       help="every stream carries its usage, in each chunk and at its end, as if it asked for "
                            "stream_options include_usage and continuous_usage_stats (vLLM's)")
    group.add_argument("--enable-server-load-tracking", action="store_true",
                       help="accepted for vLLM's command lines: GET /load always counts the requests in flight")
    group.add_argument("--max-log-len", type=int, default=None, metavar="N",
                       help="accepted for vLLM's command lines: --enable-log-requests logs no prompt text or ids "
                            "here, so no more than N of them")
    group.add_argument("--return-tokens-as-token-ids", action="store_true",
                       help='logprobs name tokens "token_id:N" rather than by their text (a request\'s '
                            "return_tokens_as_token_ids says otherwise), as vLLM: a token that is not whole "
                            "UTF-8 text is then still identified")
    group.add_argument("--middleware", action="append", default=[],
                       help="ASGI middleware class path or async function (repeatable)")
    group.add_argument("--api-server-count", type=int, default=1, help="API server processes (only 1)")
    refused = parser.add_argument_group("vLLM's server flags for what forkless does not do (refused, saying why)")
    for flag, reason in _REFUSED_FLAGS.items():
        # (vLLM's --disable-frontend-multiprocessing is a switch; the others take a value.)
        kind = {"action": "store_true", "default": None} if flag == "--disable-frontend-multiprocessing" else {}
        refused.add_argument(flag, help=reason, **kind)
    group.add_argument("--shutdown-timeout", type=_non_negative_seconds, default=DEFAULT_SHUTDOWN_TIMEOUT,
                       metavar="SECONDS",
                       help="on SIGTERM/SIGINT, stop accepting requests and let those in flight finish for "
                            "up to SECONDS, then end the rest with a 503 error (default "
                            f"{DEFAULT_SHUTDOWN_TIMEOUT:g}, as vLLM: end them at once)")
    group.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                       help="LoRA adapters served under their names (needs --enable-lora): name=path, or "
                            "the JSON form '{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'")
    group.add_argument("--io-processor-plugin", default=None, metavar="NAME",
                       help="IO processor plugin (a forkless.io_processor_plugins entry point) for /pooling "
                            "requests with a data field")
    chat = parser.add_argument_group("chat")
    chat.add_argument("--chat-template", default=None,
                      help="Jinja chat template replacing the model's: a file path, or the template text")
    chat.add_argument("--chat-template-content-format", default="auto", choices=("auto", "string", "openai"),
                      help="how the template gets each message's content: auto or string = one string (the text "
                           "parts joined), openai = a list of text parts (vLLM's)")
    chat.add_argument("--trust-request-chat-template", action="store_true",
                      help="let a request bring its own chat_template (chat completions, /tokenize and the pooling "
                           "endpoints' messages); without it such a request is a 400, as vLLM")
    chat.add_argument("--response-role", default="assistant",
                      help="the reply's role after the generation prompt (default: assistant)")
    chat.add_argument("--tool-call-parser", default=None, metavar="NAME",
                      help="tool parser turning model output into tool_calls (built-in: hermes, llama3_json)")
    chat.add_argument("--enable-auto-tool-choice", action="store_true",
                      help='parse tool calls for tool_choice="auto" (needs --tool-call-parser)')
    chat.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                      help='render the chat template without the request\'s tools when its tool_choice is "none" '
                           "(chat completions, as vLLM)")
    chat.add_argument("--tool-parser-plugin", default=None, metavar="FILE_OR_MODULE",
                      help="a .py file or module to import first; it registers tool parsers")
    chat.add_argument("--reasoning-parser", default=None, metavar="NAME",
                      help="reasoning parser giving message.reasoning (built-in: deepseek_r1, qwen3)")
    chat.add_argument("--reasoning-parser-plugin", default=None, metavar="FILE_OR_MODULE",
                      help="a .py file or module to import first; it registers reasoning parsers")
    chat.add_argument("--reasoning-config", default=None, metavar="JSON",
                      help='the reasoning markers a request\'s thinking_token_budget counts from and forces, vLLM\'s '
                           'keys: {"reasoning_start_str": "<think>", "reasoning_end_str": "</think>"} (default: '
                           "--reasoning-parser's)")
    # The server runs the model in worker processes by default (LLM runs it in-process).
    parser.set_defaults(func=cmd_serve, distributed_executor_backend="mp")


def cmd_serve(args: argparse.Namespace) -> int:
    from forkless.config import EngineArgs
    from forkless.model_loader.default_model import DEFAULT_MODEL_NAME
    from forkless.version import __version__

    # The first line, before anything slow: a start that takes a while is never silent.
    logger.info("forkless %s serve: model %s, starting", __version__,
                args.model or args.model_option or f"default ({DEFAULT_MODEL_NAME})")
    if args.api_server_count != 1:
        return _usage_error(f"--api-server-count {args.api_server_count} is not supported; "
                            "this release runs one API server process (use 1)")
    for flag, reason in _REFUSED_FLAGS.items():
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            return _usage_error(f"{flag}: {reason}")
    # The port is taken before anything slow (imports, plugins, the model): a busy one
    # fails in a second instead of after a whole model load.
    try:
        listener = bind_listener(args.host, args.port)
    except OSError as exc:
        print(f"forkless serve: error: {_listen_error(args.host, args.port, exc)}", file=sys.stderr)
        return 1
    with listener:
        return _check_and_serve(args, listener)


def _check_and_serve(args: argparse.Namespace, listener: socket.socket) -> int:
    """The rest of ``forkless serve``, holding its port: check every flag, then serve."""
    from forkless.config import AsyncEngineArgs
    from forkless.executor import get_executor_cls
    from forkless.model_loader.default_model import ModelNotFoundError
    from forkless.plugins import PluginLoadError

    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except ValueError as exc:
        return _usage_error(str(exc))
    # Every class path on the command line is imported and checked here, before the model
    # is resolved and before any engine or worker process starts: a typo fails in a second
    # with one line (check_class_paths loads the general plugins first).
    try:
        engine_args.check_class_paths()
        get_executor_cls(engine_args.distributed_executor_backend)
    except (ValueError, TypeError, ImportError, PluginLoadError) as exc:
        return _usage_error(str(exc))
    from forkless.entrypoints.openai.chat_options import ChatOptions
    from forkless.entrypoints.openai.http_limits import HttpLimits

    if args.middleware:
        # The HTTP app's module (FastAPI and every route) is imported here only to check
        # --middleware; otherwise it is imported while the engine core starts (_serve).
        from forkless.entrypoints.openai.api_server import resolve_middleware

        for path in args.middleware:
            try:
                resolve_middleware(path)
            except (ValueError, TypeError, ImportError) as exc:
                return _usage_error(f"--middleware {path!r}: {exc}")
    try:
        args.http_limits = HttpLimits.from_cli_args(args)
        args.frontend = FrontendOptions.from_cli_args(args)
        args.lora_module_paths = []
        if args.lora_modules:  # (serving_models brings the OpenAI protocol's pydantic models)
            from forkless.entrypoints.openai.serving_models import parse_lora_module

            args.lora_module_paths = [parse_lora_module(v) for v in args.lora_modules]
        if args.lora_module_paths and not engine_args.enable_lora:
            raise ValueError("--lora-modules needs --enable-lora")
        config = engine_args.create_engine_config()
        # Checked before the engine starts: a bad parser name should not cost a model load.
        args.chat_options = ChatOptions.from_cli_args(args)
        args.io_processor = _io_processor(config, args.io_processor_plugin)
    except (ValueError, TypeError, ImportError, PluginLoadError, ModelNotFoundError) as exc:
        return _usage_error(str(exc))
    return asyncio.run(run_server(config, args, listener))


def _io_processor(config: Any, name: str | None) -> Any:
    """The ``--io-processor-plugin`` processor; without the flag, the one the model's
    ``config.json`` names as ``io_processor_plugin`` (vLLM's rule), if any.

    Raises:
        ValueError: No such plugin, or the model is not a pooling model.
    """
    if name is None:
        try:
            name = json.loads((Path(config.model_config.model) / "config.json").read_text()).get("io_processor_plugin")
        except (OSError, ValueError, AttributeError):
            name = None
        if name is None:
            return None
        if config.model_config.pooler_config is None:
            logger.warning("config.json names io_processor_plugin %r, which is not used: IO processors serve "
                           "pooling models (--runner pooling), and this model generates", name)
            return None
        logger.info("config.json names io_processor_plugin %r", name)
    if config.model_config.pooler_config is None:
        raise ValueError(f"--io-processor-plugin {name!r}: IO processors serve pooling models, and this model "
                         "generates (add --runner pooling)")
    from forkless.io_processors import get_io_processor

    return get_io_processor(config, name)


def _usage_error(message: str) -> int:
    """Report a bad flag the way argparse does: one line, exit status 2."""
    print(f"forkless serve: error: {message}", file=sys.stderr)
    return 2


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind ``host:port`` and listen on it now; uvicorn serves on this socket later.

    Listening at once, not only binding, is what reserves the port: with
    ``SO_REUSEADDR`` (set, as uvicorn does, so that a restart is not refused over
    connections in TIME_WAIT) Linux lets a second socket bind a port that nobody listens
    on yet. Clients that connect before the engine is ready wait in the backlog and are
    answered once it is.

    Raises:
        OSError: The port is in use, the address is not local, or binding is not allowed.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets
    # whose proto says TCP. With it on, the second answer on a kept-alive connection, and
    # every SSE chunk after the first, waited ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(_LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _listen_error(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use (another server?); stop what listens "
                "there or choose another --port")
    return f"cannot listen on {host} port {port}: {exc.strerror or exc}"


class _Server(uvicorn.Server):
    """uvicorn's server, with signals handled here and a draining shutdown.

    uvicorn re-raises a caught SIGTERM after its own shutdown, which would kill this
    process before the engine core and workers are stopped; and its own shutdown cancels
    the requests still running after its timeout, which cuts streams and answers
    plain-text 500s with a traceback each. Here they end with OpenAI errors instead.

    Args:
        config: uvicorn's configuration.
        model_name: The served model name, for the ready line.
        engine: The engine the routes submit to (an ``AsyncLLM``).
        shutdown_timeout: Seconds the requests in flight get to finish after a signal.
    """

    def __init__(self, config: uvicorn.Config, model_name: str, engine: Any, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.model_name = model_name
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # The socket already listens (bind_listener); from here on it is served.
        await super().startup(sockets=sockets)
        port = self.servers[0].sockets[0].getsockname()[1]  # the real one, also for --port 0
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        scheme = "https" if self.config.ssl_keyfile else "http"
        logger.info("ready in %.1f s: serving %s on %s://%s:%d%s (OpenAI API at %s/v1)",
                    time.monotonic() - STARTED, self.model_name, scheme, host, port, self.config.root_path,
                    self.config.root_path)

    def request_exit(self, sig: int) -> None:
        logger.info("received %s; shutting down", signal.Signals(sig).name)
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True
        # At once, not when uvicorn's loop next notices should_exit (up to 0.1 s later):
        # from the signal on, /health is a 503 and new requests are refused.
        self.config.app.state.shutting_down = True
        self.engine.stop_accepting()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._drain()
        # uvicorn's own shutdown now finds the connections closed (it cancels any that a
        # client keeps open past _FORCE_CLOSE_AFTER_S) and runs the lifespan shutdown.
        await super().shutdown(sockets=sockets)
        if self.force_exit:
            # After a second signal uvicorn skips the lifespan shutdown; its task, still
            # waiting for that event, would be cancelled at exit and logged as an ERROR
            # with a traceback. The second signal is only meant to cut the waits short.
            await self.lifespan.shutdown()

    async def _drain(self) -> None:
        """Take no more work, give the requests in flight the shutdown timeout, then end
        the rest with a 503 error (which they deliver before their connections close).
        The Responses API's background responses, which no client waits on, get the same
        time and are then cancelled (their engine requests aborted)."""
        for server in self.servers:
            server.close()  # no new connections
        self.engine.stop_accepting()  # no new requests on the connections already open
        for connection in list(self.server_state.connections):
            connection.shutdown()  # an idle one closes now, a busy one after its response
        in_flight = self.engine.num_requests_in_flight
        if in_flight and self.shutdown_timeout > 0:
            logger.info("waiting up to %g s for %d request(s) in flight (--shutdown-timeout)",
                        self.shutdown_timeout, in_flight)
        if await self._connections_closed(self.shutdown_timeout, background=True):
            return
        await self.config.app.state.responses.shutdown()
        why = ("a second signal forced the shutdown" if self.force_exit else
               f"the request did not finish within the shutdown timeout ({self.shutdown_timeout:g} s, "
               "--shutdown-timeout)")
        ended = self.engine.abort_in_flight(f"the server is shutting down: {why}")
        if ended:
            logger.info("ended %d unfinished request(s) with a 503 error", ended)
        await self._connections_closed(_ERROR_DELIVERY_S)
        # A connection with no answer begun by now has no engine request to end (a client
        # still sending its body): close it. Its handler then sees the client gone and ends
        # quietly, where uvicorn would cancel it after its own timeout and answer a
        # plain-text 500 with a traceback in the log. An answer under way (a stream ending
        # with its error event) is left to finish.
        stuck = [c for c in self.server_state.connections
                 if getattr(c, "transport", None) is not None
                 and not getattr(getattr(c, "cycle", None), "response_started", False)]
        for connection in stuck:
            connection.transport.close()
        if stuck:
            logger.info("closed %d connection(s) that had not finished their request", len(stuck))

    async def _connections_closed(self, timeout: float, background: bool = False) -> bool:
        """Wait up to ``timeout`` s (less after a second signal) for every connection to close.

        Args:
            background: Also wait for the background responses to end.

        Returns:
            Whether they all closed (and ended).
        """
        responses = self.config.app.state.responses
        busy = lambda: bool(self.server_state.connections or (background and responses.num_background))  # noqa: E731
        deadline = time.monotonic() + timeout
        while busy() and not self.force_exit and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not busy()


async def run_server(config: Any, args: argparse.Namespace, listener: socket.socket) -> int:
    """Start the engine, then serve HTTP on ``listener`` until a signal or the engine dies.

    Returns:
        The exit status: 0 after a signal, non-zero when the engine failed or died.
    """
    from forkless.engine.async_llm import AsyncLLM

    engine = AsyncLLM(config, log_stats=not args.disable_log_stats)
    # Whatever happens below, the engine core and workers must be stopped: they are
    # non-daemon processes, and the interpreter would otherwise wait for them at exit.
    try:
        return await _serve(engine, config, args, listener)
    finally:
        engine.shutdown()


def _import_http_app() -> None:
    """Import the HTTP app's module (FastAPI, pydantic, the routes): ~0.3 s of CPU that
    runs while the engine core loads the model instead of before it starts."""
    import forkless.entrypoints.openai.api_server  # noqa: F401


async def _serve(engine: Any, config: Any, args: argparse.Namespace, listener: socket.socket) -> int:
    # A signal while the model loads (Ctrl-C, systemd's stop) ends the start-up as one
    # after it ends the drain: exit 0 with one line, not a KeyboardInterrupt traceback
    # (SIGINT) or death by the signal (SIGTERM). run_server stops the engine either way.
    loop = asyncio.get_running_loop()
    starting = asyncio.current_task()
    assert starting is not None
    stopped_by: list[int] = []

    def stop_starting(sig: int) -> None:
        logger.info("received %s while starting; shutting down", signal.Signals(sig).name)
        stopped_by.append(sig)
        starting.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_starting, sig)
    try:
        await engine.start(while_starting=_import_http_app)
    except asyncio.CancelledError:
        if not stopped_by:
            raise
        starting.uncancel()
        return 0
    except Exception as exc:
        logger.error("%s", exc)
        return 1
    from forkless.entrypoints.openai.api_server import build_app

    names = config.model_config.served_model_names
    try:
        app = build_app(engine, names, config.model_config.max_model_len, api_key=args.api_key,
                        middleware=args.middleware, metrics=engine.render_metrics,
                        chat_options=args.chat_options, limits=args.http_limits,
                        lora_modules=args.lora_module_paths, io_processor=args.io_processor,
                        log_requests=args.enable_log_requests, frontend=args.frontend,
                        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
                        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
                        enable_force_include_usage=args.enable_force_include_usage)
    except Exception as exc:
        logger.error("could not build the HTTP app: %s", exc)
        return 2
    # Everything imported and built so far lives as long as the server: out of the
    # collector's generations (as vLLM's server does; cli.main turned the collector off
    # while it was built); and streaming, the server allocates
    # a few objects per token per stream, so young collections only every
    # gc_tuning.YOUNG_THRESHOLD allocations (benchmarks/README.md, the server on the H200).
    gc.enable()
    tune_process()
    # proxy_headers=False: uvicorn would otherwise take the client's address from an
    # X-Forwarded-For header sent from 127.0.0.1, which any local client can write; the
    # scheduler's per-client share keys on that address (serving._client_key).
    server = _Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                                    timeout_graceful_shutdown=_FORCE_CLOSE_AFTER_S, proxy_headers=False,
                                    **args.http_limits.uvicorn_options(), **args.frontend.uvicorn_options()),
                     names[0], engine, args.shutdown_timeout)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.request_exit, sig)

    async def stop_when_engine_dies() -> None:
        await engine.dead_event.wait()
        logger.error("the engine died (%s); shutting the server down", engine.dead_reason)
        await asyncio.sleep(1.0)  # let in-flight requests deliver their errors
        server.should_exit = True

    watchdog = asyncio.create_task(stop_when_engine_dies())
    try:
        await server.serve(sockets=[listener])
    finally:
        watchdog.cancel()
    return 1 if engine.errored else 0
