"""``forkless disagg-proxy --prefill URL --decode URL``: disaggregated prefill.

Serves the OpenAI routes of one server in front of a prefill server and a decode server
(forkless/entrypoints/disagg_proxy.py says what each request does). It loads no model and
imports no torch: it starts in seconds and can run anywhere both servers are reachable
from.

Invariants:
    * Every flag is checked before the port is taken: a malformed URL fails at once with
      one line quoting it (exit status 2, as argparse's own errors).
    * The port is bound before uvicorn starts, as ``forkless serve`` does, so that a busy
      port fails with one line.
    * SIGTERM or SIGINT stops accepting connections and gives the streams in flight
      ``_GRACEFUL_S`` seconds before they are cut.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from typing import Any, Iterator

import uvicorn

from forkless.entrypoints.cli.arg_types import port_number
from forkless.logger import init_logger

logger = init_logger("forkless.disagg_proxy")

_GRACEFUL_S = 5.0


def _backend_url(value: str) -> str:
    """argparse type of ``--prefill`` and ``--decode``."""
    from forkless.entrypoints.disagg_proxy import check_backend_url

    try:
        return check_backend_url(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got {value!r}")
    return int(value)


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:  # nan compares false too
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value!r}")
    return seconds


def add_parser(subparsers: Any) -> None:
    from forkless.entrypoints.disagg_proxy import CONNECT_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES

    parser = subparsers.add_parser(
        "disagg-proxy", help="proxy for disaggregated prefill: each request runs on a prefill server "
                             "(max_tokens=1), then on a decode server",
        description="Serve /v1/completions and /v1/chat/completions by sending each request to a prefill "
                    "server cut to one token, then as sent to a decode server, whose answer (JSON or SSE "
                    "stream) is the client's. Also /v1/models (from the decode server) and /health (200 "
                    "when every backend is healthy). The client's Authorization header is passed on.")
    parser.add_argument("--prefill", action="append", required=True, type=_backend_url, metavar="URL",
                        help="base URL of a prefill server, http://HOST:PORT (repeat for several: used in turn)")
    parser.add_argument("--decode", action="append", required=True, type=_backend_url, metavar="URL",
                        help="base URL of a decode server, http://HOST:PORT (repeat for several: used in turn)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8000, help="port to listen on (default 8000)")
    parser.add_argument("--connect-timeout", type=_positive_seconds, default=CONNECT_TIMEOUT_S, metavar="SECONDS",
                        help=f"seconds to connect to a backend (default {CONNECT_TIMEOUT_S:g}); reading has no "
                             "timeout, generations may be long")
    parser.add_argument("--max-request-body-size", type=_positive_int, default=DEFAULT_MAX_BODY_BYTES,
                        metavar="BYTES", help=f"refuse larger request bodies with 413 (default {DEFAULT_MAX_BODY_BYTES})")
    parser.add_argument("--uvicorn-log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug", "trace"])
    parser.set_defaults(func=cmd_disagg_proxy)


def cmd_disagg_proxy(args: argparse.Namespace) -> int:
    from forkless.entrypoints.cli.serve import _listen_error, bind_listener
    from forkless.entrypoints.disagg_proxy import build_proxy_app

    app = build_proxy_app(args.prefill, args.decode, connect_timeout=args.connect_timeout,
                          max_body_bytes=args.max_request_body_size)
    try:
        listener = bind_listener(args.host, args.port)
    except OSError as exc:
        print(f"forkless disagg-proxy: error: {_listen_error(args.host, args.port, exc)}", file=sys.stderr)
        return 1
    logger.info("disagg-proxy on http://%s:%d: prefill %s, decode %s", args.host, args.port,
                ", ".join(args.prefill), ", ".join(args.decode))
    config = uvicorn.Config(app, log_level=args.uvicorn_log_level, timeout_graceful_shutdown=_GRACEFUL_S)
    with listener:
        asyncio.run(_serve(_Server(config), listener))
    return 0


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handling, which re-raises the signal after
    shutting down (exit status -15 for a clean stop); ``_serve`` handles signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve(server: uvicorn.Server, listener: socket.socket) -> None:
    def stop() -> None:
        # The first signal drains (up to _GRACEFUL_S), a second one cuts the streams now.
        server.force_exit = server.should_exit
        server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    await server.serve(sockets=[listener])
