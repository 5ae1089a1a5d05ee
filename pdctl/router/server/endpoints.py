"""The router's own GET routes: /health, /stats, /metrics, and /v1/models (a decode's list)."""

from __future__ import annotations

import httpx
from starlette.types import Receive, Send

from pdctl.router import jsonx
from pdctl.router.errors import send_bytes, send_error
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.state import RouterState


async def health(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    roles = (state.decode,) if state.config.mode == "aggregated" else (state.prefill, state.decode)
    pools = {p.role: {"healthy": len(p.healthy()), "total": len(p.members)} for p in roles}
    down = [role for role, n in pools.items() if not n["healthy"]]
    if down:
        reason = "no healthy engine" if len(roles) == 1 else " and ".join(f"no healthy {r} instance" for r in down)
        await send_bytes(send, 503, jsonx.dumps({"status": "unavailable", "reason": reason, **pools}))
    else:
        await send_bytes(send, 200, jsonx.dumps({"status": "ok", "live_handles": len(state.handles), **pools}))


async def stats(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    await send_bytes(send, 200, jsonx.dumps(state.stats()))


async def metrics(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    body = state.exposition()
    await send_bytes(send, 200, body, content_type=b"text/plain; version=0.0.4; charset=utf-8")


async def models(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    for u in state.decode.healthy():
        try:
            resp = await state.http.get(f"{u.url}/v1/models")
        except httpx.HTTPError:
            continue
        if resp.status_code == 200:
            await send_bytes(send, 200, resp.content)
            return
    await send_error(send, 503, "no decode instance answered /v1/models")
