"""vLLM's development routes, served with ``FORKLESS_SERVER_DEV_MODE=1``.

``POST /reset_prefix_cache`` (``?reset_running_requests=``, ``?reset_external=``) answers
``{"success": bool}``; ``POST /sleep?level=1|2[&mode=abort|wait]`` ``{"status": "sleeping", "level": N}``
(``--enable-sleep-mode``); ``POST /wake_up`` (``?tags=weights&tags=kv_cache``, none: all)
``{"status": "awake", "tags": [...] | null}``; ``GET /is_sleeping`` ``{"is_sleeping": bool}``.
The same calls as ``AsyncLLM``'s methods of those names, run by the engine core between
its steps.

Invariants:
    * A value the call refuses (a bad level or tag, sleep mode off) is a 400 naming it; a
      call the engine's state forbids now (asleep already, awake, the KV cache woken
      before the weights) is a 409; both with the OpenAI error body.
    * ``/sleep`` ends the requests in flight first (vLLM's default ``mode=abort``: their
      streams end with ``finish_reason`` ``abort``), or lets them finish (``mode=wait``,
      new ones refused meanwhile); requests sent while the engine sleeps are refused (503)
      until ``/wake_up``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable

from fastapi import FastAPI, Query, Request

from forkless.entrypoints.openai.errors import BadRequest
from forkless.logger import init_logger

if TYPE_CHECKING:
    from forkless.engine.async_llm import AsyncLLM

logger = init_logger(__name__)


async def _answer(call: Awaitable[Any], param: str | None = None) -> Any:
    """``call``'s result; its refusals as HTTP errors (see the module)."""
    from forkless.engine.async_llm import EngineDeadError

    try:
        return await call
    except EngineDeadError:
        raise  # (a 503, by its handler)
    except (ValueError, TypeError) as exc:
        raise BadRequest(str(exc), param) from None
    except RuntimeError as exc:
        raise BadRequest(str(exc), param, status=409, err_type="ConflictError") from None


def attach_dev_routes(app: FastAPI, engine: AsyncLLM) -> None:
    """Add the development routes to ``app`` (see the module)."""

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(reset_running_requests: bool = Query(default=False),
                                 reset_external: bool = Query(default=False)) -> dict[str, bool]:
        logger.info("resetting the prefix cache%s", " and the KV connector's store" if reset_external else "")
        return {"success": await _answer(engine.reset_prefix_cache(reset_running_requests, reset_external))}

    @app.post("/sleep")
    async def sleep(level: int = Query(default=1), mode: str = Query(default="abort")) -> dict[str, Any]:
        await _answer(engine.sleep(level, mode), "mode" if mode not in ("abort", "wait") else "level")
        return {"status": "sleeping", "level": level}

    @app.post("/wake_up")
    async def wake_up(raw_request: Request) -> dict[str, Any]:
        tags = raw_request.query_params.getlist("tags") or None
        awake = await _answer(engine.wake_up(tags), "tags")
        return {"status": "awake" if awake else "sleeping", "tags": tags}

    @app.get("/is_sleeping")
    async def is_sleeping() -> dict[str, bool]:
        return {"is_sleeping": await _answer(engine.is_sleeping())}
