"""vLLM's development routes, served with ``FORKLESS_SERVER_DEV_MODE=1``.

``POST /reset_prefix_cache`` (``?reset_running_requests=``, ``?reset_external=``) answers
``{"success": bool}``; ``POST /sleep?level=0|1|2[&mode=abort|wait|keep]``
``{"status": "sleeping", "level": N}`` (levels 1 and 2 need ``--enable-sleep-mode``);
``POST /wake_up`` (``?tags=weights&tags=kv_cache``, ``scheduling``; none: all)
``{"status": "awake" | "sleeping", "tags": [...] | null}``; ``GET /is_sleeping``
``{"is_sleeping": bool}``; vLLM's RL routes ``POST /pause?mode=abort|wait|keep[&clear_cache=]``
``{"status": "paused"}``, ``POST /resume`` ``{"status": "resumed"}``, ``GET /is_paused``
``{"is_paused": bool}`` and ``POST /abort_requests`` (``{"request_ids": [...]}``, each a
response id or the client's own id; none: every request) ``{"status": "aborted",
"aborted": N}``. The same calls as ``AsyncLLM``'s methods (``pause_generation``,
``resume_generation``, ``abort``), run by the engine core between its steps.

Invariants:
    * A value the call refuses (a bad level, mode or tag, sleep mode off) is a 400 naming
      it; a call the engine's state forbids now (asleep already, awake, the KV cache woken
      before the weights, resumed while asleep) is a 409; both with the OpenAI error body.
    * ``/pause`` and ``/sleep`` answer once nothing runs: the requests in flight ended
      (``mode=abort``, vLLM's default: their streams end with ``finish_reason`` ``abort``),
      finished (``wait``) or frozen (``keep``, their KV cache kept). Requests sent while
      paused or asleep are taken and wait; they run after ``/resume`` or the ``/wake_up``
      that wakes everything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable

from fastapi import Depends, FastAPI, Query, Request

from forkless.entrypoints.openai.errors import BadRequest
from forkless.entrypoints.openai.serving import check_unknown_fields, request_names
from forkless.protocol.openai import AbortRequestsRequest
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


def _only(*names: str, repeated: str | None = None) -> Any:
    """A dependency refusing query parameters other than ``names``, and any of them given
    twice but ``repeated`` (a list): none is ignored, or picked among several."""

    def check(request: Request) -> None:
        params = request.query_params
        for name in params:
            if name not in names:
                known = f"expected only {', '.join(names)}" if names else "it takes none"
                raise BadRequest(f"unknown query parameter {name!r} for {request.url.path}: {known}", name)
            if name != repeated and len(params.getlist(name)) > 1:
                raise BadRequest(f"query parameter {name!r} is given {len(params.getlist(name))} times: expected "
                                 "one value", name)

    return Depends(check)


def attach_dev_routes(app: FastAPI, engine: AsyncLLM) -> None:
    """Add the development routes to ``app`` (see the module)."""

    @app.post("/reset_prefix_cache", dependencies=[_only("reset_running_requests", "reset_external")])
    async def reset_prefix_cache(reset_running_requests: bool = Query(default=False),
                                 reset_external: bool = Query(default=False)) -> dict[str, bool]:
        logger.info("resetting the prefix cache%s", " and the KV connector's store" if reset_external else "")
        return {"success": await _answer(engine.reset_prefix_cache(reset_running_requests, reset_external))}

    @app.post("/sleep", dependencies=[_only("level", "mode")])
    async def sleep(level: int = Query(default=1), mode: str = Query(default="abort")) -> dict[str, Any]:
        # (The refused value: the level, or a mode that is not one, or "keep" above level 0.)
        await _answer(engine.sleep(level, mode), "level" if level not in (0, 1, 2) or mode in ("abort", "wait")
                      else "mode")
        return {"status": "sleeping", "level": level}

    @app.post("/wake_up", dependencies=[_only("tags", repeated="tags")])
    async def wake_up(raw_request: Request) -> dict[str, Any]:
        tags = raw_request.query_params.getlist("tags") or None
        awake = await _answer(engine.wake_up(tags), "tags")
        return {"status": "awake" if awake else "sleeping", "tags": tags}

    @app.get("/is_sleeping", dependencies=[_only()])
    async def is_sleeping() -> dict[str, bool]:
        return {"is_sleeping": await _answer(engine.is_sleeping())}

    @app.post("/pause", dependencies=[_only("mode", "clear_cache")])
    async def pause(mode: str = Query(default="abort"), clear_cache: bool = Query(default=True)) -> dict[str, str]:
        await _answer(engine.pause_generation(mode=mode, clear_cache=clear_cache), "mode")
        return {"status": "paused"}

    @app.post("/resume", dependencies=[_only()])
    async def resume() -> dict[str, str]:
        await _answer(engine.resume_generation())
        return {"status": "resumed"}

    @app.get("/is_paused", dependencies=[_only()])
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": await _answer(engine.is_paused())}

    @app.post("/abort_requests", dependencies=[_only()])
    async def abort_requests(req: AbortRequestsRequest | None = None) -> dict[str, Any]:
        if req is not None:
            check_unknown_fields(req)
        wanted = set(req.request_ids or ()) if req is not None else set()
        ids = [rid for rid in engine.requests_in_flight if not wanted or wanted & request_names(rid)]
        if ids:
            await engine.abort(ids)
        return {"status": "aborted", "aborted": len(ids)}

