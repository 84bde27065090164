"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


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


def error_response(message: str, status: int = 400, err_type: str = "BadRequestError",
                   param: str | None = None, code: Any = None) -> JSONResponse:
    body = {"error": {"message": message, "type": err_type, "param": param,
                      "code": status if code is None else code}}
    return JSONResponse(body, status_code=status)
