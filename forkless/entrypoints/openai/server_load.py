"""``GET /load``: how many requests the server is working on (vLLM's ``server_load``).

A load balancer in front of several servers reads it to send the next request to the least
loaded one.

Invariants:
    * A request counts from the moment it reaches the ASGI app until its response has
      been sent whole (a stream: until its last event) or its client has gone: the count
      never stays raised by a request that has ended, however it ended.
    * Only the routes that run the engine count (vLLM's list: generation, Responses, pooling,
      and SageMaker's ``/invocations``); ``/health``, ``/metrics``, ``/tokenize``... do not.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

#: The counted routes; a Responses API request by id (GET, DELETE, cancel) counts as in vLLM.
COUNTED_PREFIXES = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/pooling",
                    "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/invocations")


def is_counted(path: str) -> bool:
    """Whether a request to ``path`` counts in the server's load."""
    return any(path == p or path.startswith(p + "/") for p in COUNTED_PREFIXES)


class ServerLoadMiddleware:
    """Counts the requests in flight on the counted routes in its :class:`ServerLoad`."""

    def __init__(self, app: ASGIApp, tracker: "ServerLoad") -> None:
        self.app = app
        self.tracker = tracker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_counted(scope["path"]):
            await self.app(scope, receive, send)
            return
        self.tracker.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.tracker.in_flight -= 1


class ServerLoad:
    """The count :class:`ServerLoadMiddleware` keeps."""

    def __init__(self) -> None:
        self.in_flight = 0
