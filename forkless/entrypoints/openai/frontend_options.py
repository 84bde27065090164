"""How the HTTP front end is exposed: CORS, a root path behind a proxy, TLS, the docs pages
and the access log (vLLM's ``FrontendArgs`` of the same names).

Invariants:
    * CORS is off unless ``--allowed-origins`` is given. vLLM answers every origin by
      default (``["*"]``); here a page on another site, open in the browser of someone
      whose machine runs the server on loopback, cannot read its answers unless asked
      for. ``--allowed-origins '["*"]'`` restores vLLM's default.
    * With CORS on, a preflight (``OPTIONS``) is answered by the CORS layer, outside the
      API-key check: browsers never send credentials on a preflight.
    * TLS needs both ``--ssl-keyfile`` and ``--ssl-certfile``; the files are read before
      the engine starts, so a wrong path fails in a second, not after a model load.
    * This module imports only the standard library: ``forkless serve`` builds it before
      its slow imports.
"""

from __future__ import annotations

import json
import ssl
import uuid
from dataclasses import dataclass, field
from typing import Any

# The ssl module's names for --ssl-cert-reqs (vLLM takes the integer values).
_CERT_REQS = {int(ssl.CERT_NONE): "none", int(ssl.CERT_OPTIONAL): "optional", int(ssl.CERT_REQUIRED): "required"}


def _json_list(flag: str, value: Any) -> list[str]:
    """A flag's list of strings: a JSON list (vLLM's form) or one bare value."""
    if isinstance(value, list):
        items = value
    else:
        try:
            items = json.loads(value)
        except json.JSONDecodeError:
            items = [value]  # --allowed-origins http://localhost:3000 (no JSON needed for one)
        if isinstance(items, str):
            items = [items]
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        raise ValueError(f"{flag} {value!r} is invalid: expected a JSON list of non-empty strings, "
                         'e.g. \'["http://localhost:3000"]\'')
    return items


@dataclass(frozen=True)
class FrontendOptions:
    """``forkless serve``'s options for how the HTTP app is reached.

    Attributes:
        allowed_origins: Origins browsers may call from (CORS); empty: CORS off.
        allow_credentials: CORS: allow cookies and ``Authorization`` from those origins.
        allowed_methods: CORS: the methods allowed (default every one).
        allowed_headers: CORS: the request headers allowed (default every one).
        root_path: The path prefix a proxy serves the app under (ASGI ``root_path``).
        disable_fastapi_docs: No ``/docs``, ``/redoc`` or ``/openapi.json``.
        disable_uvicorn_access_log: No access-log line per request.
        ssl_keyfile: TLS private key (PEM).
        ssl_certfile: TLS certificate chain (PEM).
        ssl_ca_certs: CA bundle for client certificates.
        ssl_cert_reqs: Whether clients must present a certificate (``ssl.CERT_*``).
        enable_request_id_headers: Answer every request with an ``X-Request-Id`` header:
            the client's own, else a new one.
    """

    allowed_origins: list[str] = field(default_factory=list)
    allow_credentials: bool = False
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    root_path: str = ""
    disable_fastapi_docs: bool = False
    disable_uvicorn_access_log: bool = False
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = int(ssl.CERT_NONE)
    enable_request_id_headers: bool = False

    def __post_init__(self) -> None:
        if self.root_path and (not self.root_path.startswith("/") or self.root_path.endswith("/")):
            raise ValueError(f"--root-path {self.root_path!r} is invalid: expected a path such as /llm "
                             "(a leading /, no trailing /)")
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ValueError("TLS needs both --ssl-keyfile and --ssl-certfile")
        if self.ssl_cert_reqs not in _CERT_REQS:
            raise ValueError(f"--ssl-cert-reqs {self.ssl_cert_reqs} is invalid: expected "
                             + ", ".join(f"{k} ({v})" for k, v in _CERT_REQS.items()))
        if self.ssl_cert_reqs != ssl.CERT_NONE and self.ssl_ca_certs is None:
            raise ValueError("--ssl-cert-reqs asks clients for certificates: give --ssl-ca-certs to check them")
        if self.ssl_keyfile is None and (self.ssl_ca_certs is not None or self.ssl_cert_reqs != ssl.CERT_NONE):
            raise ValueError("--ssl-ca-certs and --ssl-cert-reqs need TLS: give --ssl-keyfile and --ssl-certfile")
        if self.ssl_keyfile is not None:
            self.ssl_context()  # a wrong path, a bad key or a key that fits no certificate fails now

    @classmethod
    def from_cli_args(cls, args: Any) -> "FrontendOptions":
        """The options given by ``forkless serve``'s flags.

        Raises:
            ValueError: A value is malformed, or the TLS files cannot be loaded.
        """
        return cls(
            allowed_origins=_json_list("--allowed-origins", args.allowed_origins) if args.allowed_origins else [],
            allow_credentials=args.allow_credentials,
            allowed_methods=_json_list("--allowed-methods", args.allowed_methods),
            allowed_headers=_json_list("--allowed-headers", args.allowed_headers),
            root_path=args.root_path or "",
            disable_fastapi_docs=args.disable_fastapi_docs,
            disable_uvicorn_access_log=args.disable_uvicorn_access_log,
            ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile, ssl_ca_certs=args.ssl_ca_certs,
            ssl_cert_reqs=args.ssl_cert_reqs, enable_request_id_headers=args.enable_request_id_headers,
        )

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_keyfile else "http"

    def ssl_context(self) -> ssl.SSLContext:
        """The server's TLS context.

        Raises:
            ValueError: A file is missing or does not hold what it should.
        """
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
            if self.ssl_ca_certs:
                context.load_verify_locations(self.ssl_ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"TLS files (--ssl-certfile {self.ssl_certfile}, --ssl-keyfile {self.ssl_keyfile}"
                             + (f", --ssl-ca-certs {self.ssl_ca_certs}" if self.ssl_ca_certs else "")
                             + f") cannot be loaded: {exc}") from None
        context.verify_mode = ssl.VerifyMode(self.ssl_cert_reqs)
        return context

    def fastapi_options(self) -> dict[str, Any]:
        """Keyword arguments for ``FastAPI(...)``."""
        if self.disable_fastapi_docs:
            return {"docs_url": None, "redoc_url": None, "openapi_url": None}
        return {}

    def uvicorn_options(self) -> dict[str, Any]:
        """Keyword arguments for ``uvicorn.Config``."""
        options: dict[str, Any] = {"root_path": self.root_path, "access_log": not self.disable_uvicorn_access_log}
        if self.ssl_keyfile:
            options.update(ssl_keyfile=self.ssl_keyfile, ssl_certfile=self.ssl_certfile,
                           ssl_ca_certs=self.ssl_ca_certs, ssl_cert_reqs=self.ssl_cert_reqs)
        return options

    def add_middleware(self, app: Any) -> None:
        """Add the request-id headers and CORS (each only when asked for).

        Added last, so that they are the outermost layers: every answer, a refused key's
        included, carries them, and preflights never reach the key check.
        """
        if self.enable_request_id_headers:
            app.add_middleware(RequestIdHeaderMiddleware)
        if self.allowed_origins:
            from starlette.middleware.cors import CORSMiddleware

            app.add_middleware(CORSMiddleware, allow_origins=self.allowed_origins,
                               allow_credentials=self.allow_credentials, allow_methods=self.allowed_methods,
                               allow_headers=self.allowed_headers)


class RequestIdHeaderMiddleware:
    """ASGI middleware: ``X-Request-Id`` on every HTTP answer, the request's own (which the
    completions and chat endpoints also take as the response id) or a new random one."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"")
        request_id = given or uuid.uuid4().hex.encode()

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id)]
            await send(message)

        await self.app(scope, receive, send_with_id)


def add_cli_args(group: Any) -> None:
    """``forkless serve``'s front-end flags (vLLM's names and forms)."""
    group.add_argument("--allowed-origins", default=None, metavar="JSON",
                       help='origins browsers may call the API from (CORS), a JSON list such as '
                            '\'["http://localhost:3000"]\' or \'["*"]\'; default: none (CORS off; vLLM allows '
                            "every origin)")
    group.add_argument("--allow-credentials", action="store_true",
                       help="CORS: allow cookies and Authorization headers from --allowed-origins")
    group.add_argument("--allowed-methods", default='["*"]', metavar="JSON",
                       help="CORS: the HTTP methods allowed, a JSON list (default every one)")
    group.add_argument("--allowed-headers", default='["*"]', metavar="JSON",
                       help="CORS: the request headers allowed, a JSON list (default every one)")
    group.add_argument("--root-path", default=None, metavar="PATH",
                       help="the path prefix a reverse proxy serves the API under (e.g. /llm)")
    group.add_argument("--disable-fastapi-docs", action="store_true",
                       help="serve no /docs, /redoc or /openapi.json")
    group.add_argument("--disable-uvicorn-access-log", action="store_true",
                       help="no access-log line per request")
    group.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this private key (PEM)")
    group.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate chain (PEM)")
    group.add_argument("--ssl-ca-certs", default=None, help="CA certificates that client certificates are checked with")
    group.add_argument("--enable-request-id-headers", action="store_true",
                       help="answer every request with an X-Request-Id header (the client's, else a new one)")
    group.add_argument("--ssl-cert-reqs", type=int, default=int(ssl.CERT_NONE),
                       help="whether clients must send a certificate: 0 no (default), 1 optional, 2 required")
