"""``forkless serve [MODEL]``: the OpenAI-compatible server.

Three kinds of process: this one (API server: FastAPI + uvicorn, tokenizer, stat
loggers), the engine core (scheduler, KV cache, executor) and the workers (model). The
engine core and workers are spawned; each loads the general plugins itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import time
from typing import Any, Iterator

import uvicorn

from forkless import envs
from forkless.entrypoints.cli.main import STARTED
from forkless.logger import init_logger

logger = init_logger("forkless.serve")


def add_parser(subparsers: Any) -> None:
    from forkless.config import EngineArgs

    parser = subparsers.add_parser(
        "serve", help="serve a model over the OpenAI API (default: the embedded SmolLM2-135M-Instruct)")
    EngineArgs.add_cli_args(parser, model_positional=True)
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    group.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    group.add_argument("--api-key", default=envs.FORKLESS_API_KEY,
                       help="require 'Authorization: Bearer KEY' on every route but /health, /version and "
                            "/metrics (or FORKLESS_API_KEY)")
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
    group.add_argument("--middleware", action="append", default=[],
                       help="ASGI middleware class path or async function (repeatable)")
    group.add_argument("--api-server-count", type=int, default=1, help="API server processes (only 1)")
    chat = parser.add_argument_group("chat")
    chat.add_argument("--chat-template", default=None,
                      help="Jinja chat template replacing the model's: a file path, or the template text")
    chat.add_argument("--tool-call-parser", default=None, metavar="NAME",
                      help="tool parser turning model output into tool_calls (built-in: hermes, llama3_json)")
    chat.add_argument("--enable-auto-tool-choice", action="store_true",
                      help='parse tool calls for tool_choice="auto" (needs --tool-call-parser)')
    chat.add_argument("--tool-parser-plugin", default=None, metavar="FILE_OR_MODULE",
                      help="a .py file or module to import first; it registers tool parsers")
    chat.add_argument("--reasoning-parser", default=None, metavar="NAME",
                      help="reasoning parser giving message.reasoning (built-in: deepseek_r1, qwen3)")
    chat.add_argument("--reasoning-parser-plugin", default=None, metavar="FILE_OR_MODULE",
                      help="a .py file or module to import first; it registers reasoning parsers")
    # The server runs the model in worker processes by default (LLM runs it in-process).
    parser.set_defaults(func=cmd_serve, distributed_executor_backend="mp")


def cmd_serve(args: argparse.Namespace) -> int:
    from forkless.config import EngineArgs
    from forkless.model_loader.default_model import DEFAULT_MODEL_NAME
    from forkless.version import __version__

    # The first line, before anything slow: a start that takes a while is never silent.
    logger.info("forkless %s serve: model %s, starting", __version__,
                args.model or f"default ({DEFAULT_MODEL_NAME})")
    if args.api_server_count != 1:
        return _usage_error(f"--api-server-count {args.api_server_count} is not supported; "
                            "this release runs one API server process (use 1)")
    from forkless.executor import get_executor_cls
    from forkless.plugins import PluginLoadError

    engine_args = EngineArgs.from_cli_args(args)
    # Every class path on the command line is imported and checked here, before the model
    # is resolved and before any engine or worker process starts: a typo fails in a second
    # with one line (check_class_paths loads the general plugins first).
    try:
        engine_args.check_class_paths()
        get_executor_cls(engine_args.distributed_executor_backend)
    except (ValueError, TypeError, ImportError, PluginLoadError) as exc:
        return _usage_error(str(exc))
    from forkless.entrypoints.openai.api_server import resolve_middleware
    from forkless.entrypoints.openai.chat_options import ChatOptions
    from forkless.entrypoints.openai.http_limits import HttpLimits

    for path in args.middleware:
        try:
            resolve_middleware(path)
        except (ValueError, TypeError, ImportError) as exc:
            return _usage_error(f"--middleware {path!r}: {exc}")
    try:
        args.http_limits = HttpLimits.from_cli_args(args)
        config = engine_args.create_engine_config()
        # Checked before the engine starts: a bad parser name should not cost a model load.
        args.chat_options = ChatOptions.from_cli_args(args)
    except (ValueError, TypeError, ImportError, PluginLoadError) as exc:
        return _usage_error(str(exc))
    return asyncio.run(run_server(config, args))


def _usage_error(message: str) -> int:
    """Report a bad flag the way argparse does: one line, exit status 2."""
    print(f"forkless serve: error: {message}", file=sys.stderr)
    return 2


class _Server(uvicorn.Server):
    """uvicorn's server, with signals handled here: uvicorn re-raises a caught SIGTERM
    after its own shutdown, which would kill this process before the engine core and
    workers are stopped."""

    def __init__(self, config: uvicorn.Config, model_name: str) -> None:
        super().__init__(config)
        self.model_name = model_name

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn exits the process when it cannot listen; returning means it listens.
        await super().startup(sockets=sockets)
        port = self.servers[0].sockets[0].getsockname()[1]  # the real one, also for --port 0
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        logger.info("ready in %.1f s: serving %s on http://%s:%d (OpenAI API at /v1)",
                    time.monotonic() - STARTED, self.model_name, host, port)

    def request_exit(self, sig: int) -> None:
        logger.info("received %s; shutting down", signal.Signals(sig).name)
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True


async def run_server(config: Any, args: argparse.Namespace) -> int:
    from forkless.engine.async_llm import AsyncLLM

    engine = AsyncLLM(config, log_stats=not args.disable_log_stats)
    # Whatever happens below, the engine core and workers must be stopped: they are
    # non-daemon processes, and the interpreter would otherwise wait for them at exit.
    try:
        return await _serve(engine, config, args)
    finally:
        engine.shutdown()


async def _serve(engine: Any, config: Any, args: argparse.Namespace) -> int:
    from forkless.entrypoints.openai.api_server import build_app

    try:
        await engine.start()
    except Exception as exc:
        logger.error("%s", exc)
        return 1
    names = [config.model_config.served_model_name]
    try:
        app = build_app(engine, names, config.model_config.max_model_len, api_key=args.api_key,
                        middleware=args.middleware, metrics=engine.render_metrics,
                        chat_options=args.chat_options, limits=args.http_limits)
    except Exception as exc:
        logger.error("could not build the HTTP app: %s", exc)
        return 2
    server = _Server(uvicorn.Config(app, host=args.host, port=args.port,
                                    log_level=args.uvicorn_log_level, timeout_graceful_shutdown=5,
                                    **args.http_limits.uvicorn_options()),
                     names[0])
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
        await server.serve()
    finally:
        watchdog.cancel()
    return 1 if engine.errored else 0
