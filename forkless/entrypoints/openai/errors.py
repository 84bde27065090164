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


def describe_validation_errors(errors: Sequence[Any], body: Any = None) -> tuple[str, str | None]:
    """A message and the ``param`` for pydantic's errors on a request body.

    ``param`` is the dotted location of the first error in the client's names
    (``messages.0.content``: see :func:`_client_path`), or the one a request-level check
    puts in its context (see ``RequestModel``). The message keeps pydantic's locations,
    which say which alternative of a union failed how.

    Args:
        errors: pydantic's errors.
        body: The decoded request body, when there was one.
    """
    first = errors[0] if errors else {}
    ctx = first.get("ctx") or {}
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {ctx.get('error', first.get('msg'))}", None

    def where(error: Any, path: Sequence[Any]) -> str:
        return ".".join(map(str, path)) or (error.get("ctx") or {}).get("param") or "body"

    def loc(error: Any) -> list[Any]:
        # (FastAPI's first step says where the value was: the body, or a query parameter,
        # which the client names without it.)
        path = list(error.get("loc", ()))
        if path[:1] in (["query"], ["path"], ["header"]):
            path = path[1:]
        return [p for p in path if p != "body"]

    shown = [f"{where(e, loc(e))}: {e.get('msg')}" for e in errors[:MAX_SHOWN_ERRORS]]
    if len(errors) > MAX_SHOWN_ERRORS:
        shown.append(f"... and {len(errors) - MAX_SHOWN_ERRORS} more errors")
    param = where(first, _client_path(loc(first), body, first.get("type") == "missing")) if errors else None
    return "; ".join(shown) or "invalid request", None if param == "body" else param


def _client_path(loc: Sequence[Any], body: Any, missing: bool) -> list[Any]:
    """An error location without the steps that are not in the request body.

    pydantic puts the member of a union that failed into the location
    (``tool_choice.literal['none','auto','required']``, ``messages.0.content.str``); a
    client knows only its own keys and indexes. Following the location through the body
    keeps the steps the body has, and the last step of a missing field (which it cannot
    have). Without a decoded body the location is kept as it is.
    """
    if not isinstance(body, (dict, list)):
        return list(loc)
    path, value = [], body
    for i, step in enumerate(loc):
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, list) and type(step) is int and 0 <= step < len(value):
            value = value[step]
        elif not (missing and i == len(loc) - 1):
            continue
        path.append(step)
    return path


def error_bytes(message: str, status: int) -> bytes:
    """The error body as bytes, for middleware that answers without a Response object."""
    return json.dumps(error_body(message, status)).encode("utf-8")
