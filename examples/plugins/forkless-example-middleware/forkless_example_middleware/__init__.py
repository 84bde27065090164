"""HTTP middleware: ``forkless serve --middleware forkless_example_middleware:add_process_time``.

An async function ``(request, call_next)`` (or an ASGI middleware class) runs around every
request the API server handles.
"""

import time


async def add_process_time(request, call_next):
    start = time.perf_counter()
    response = await call_next(request)
    response.headers["x-process-time-ms"] = f"{(time.perf_counter() - start) * 1e3:.1f}"
    return response
