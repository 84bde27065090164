"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}``.

Invariants:
    * Every error the server answers has this shape, whatever raised it (a route, body
      parsing, routing, the HTTP limits, authentication).
    * Rendering an error never fails: the message may quote client input, which can be
      anything JSON carries (lone surrogates, megabytes); it is cut to a bounded length
      and made encodable first.
"""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from typing import Any, Sequence

# starlette's JSONResponse (fastapi.responses re-exports this class): the HTTP limits use
# this module before the engine starts, and importing fastapi there cost ~0.3 s of CPU.
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

# The ``type`` of an error by HTTP status, in the style of the OpenAI clients' exception
# names (openai.NotFoundError, ...).
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}

# Longest client value an error message quotes: enough to recognize it, never the whole
# multi-megabyte input echoed back.
MAX_QUOTED = 200
MAX_MESSAGE = 4000
# Validation errors listed in one message (a list of a million bad items has as many).
MAX_SHOWN_ERRORS = 5
# What pydantic puts in an error's location to say which member of a union failed
# (``stop.str``, ``tool_choice.literal['none','auto','required']``, a model's class
# name): a type, never a field, so ``param`` leaves it out.
_UNION_MEMBER = re.compile(r"str|int|float|bool|bytes|[a-z-]+\[.*\]|[A-Z][A-Za-z0-9]*")


def error_type(status: int) -> str:
    """The ``type`` of an error with this HTTP status."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    try:
        return HTTPStatus(status).phrase.title().replace(" ", "") + "Error"
    except ValueError:
        return "Error"


def quoted(value: Any, limit: int = MAX_QUOTED) -> str:
    """``value`` for an error message: its text cut to ``limit`` characters, lone
    surrogates escaped (they cannot be encoded as UTF-8)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text)} characters)"
    return _encodable(text)


def _encodable(text: str) -> str:
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class BadRequest(Exception):
    """A request the server refuses; becomes an HTTP error with an OpenAI-style body."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400,
                 err_type: str = "BadRequestError", code: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.err_type = err_type
        self.code = status if code is None else code


class RequestBodyError(HTTPException):
    """The request body broke an HTTP limit (too large, or too slow to arrive).

    An ``HTTPException`` so that FastAPI's body reading lets it through unchanged (it turns
    any other exception into "There was an error parsing the body"). The connection is
    closed after the answer: the rest of the body is not read.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message, headers={"connection": "close"})


def error_body(message: str, status: int = 400, err_type: str | None = None,
               param: str | None = None, code: Any = None) -> dict[str, Any]:
    """The error object (always encodable as UTF-8 JSON)."""
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + "..."
    return {"error": {"message": _encodable(message), "type": err_type or error_type(status),
                      "param": None if param is None else quoted(param),
                      "code": status if code is None else code}}


def error_response(message: str, status: int = 400, err_type: str | None = None,
                   param: str | None = None, code: Any = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """A JSON response with an OpenAI-style error body."""
    return JSONResponse(error_body(message, status, err_type, param, code), status_code=status, headers=headers)


def describe_validation_errors(errors: Sequence[Any]) -> tuple[str, str | None]:
    """A message and the ``param`` for pydantic's errors on a request body.

    ``param`` is the dotted location of the first error (``messages.0.content``), without
    the union members the message names, or the one a request-level check puts in its
    context (see ``RequestModel``).
    """
    first = errors[0] if errors else {}
    ctx = first.get("ctx") or {}
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {ctx.get('error', first.get('msg'))}", None

    def where(error: Any) -> str:
        loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        return loc or (error.get("ctx") or {}).get("param") or "body"

    shown = [f"{where(e)}: {e.get('msg')}" for e in errors[:MAX_SHOWN_ERRORS]]
    if len(errors) > MAX_SHOWN_ERRORS:
        shown.append(f"... and {len(errors) - MAX_SHOWN_ERRORS} more errors")
    fields = [p for p in first.get("loc", ()) if not (isinstance(p, str) and _UNION_MEMBER.fullmatch(p))]
    param = where({**first, "loc": fields}) if errors else None
    return "; ".join(shown) or "invalid request", None if param == "body" else param


def error_bytes(message: str, status: int) -> bytes:
    """The error body as bytes, for middleware that answers without a Response object."""
    return json.dumps(error_body(message, status)).encode("utf-8")
