"""`POST /reset_prefix_cache`: the router's counterpart of vLLM's route of that name, for benchmark tools that
reset the server's KV cache between runs (AIPerf's `--reset-kv-cache`).

What one engine's reset cannot do behind a P/D router, this does in order: drop every handle the router holds (the
next turn of each conversation misses, `released`) and release their blocks on the decodes, wait (bounded) for
those releases, then reset every engine's prefix cache, prefills and decodes. A vLLM engine serves the route only
with `VLLM_SERVER_DEV_MODE=1` (pdctl's plan sets it); one that refuses is named in the answer, a 502.

The answer says what was done: the handles released, and each engine's URL, role and status. An admin route: it
asks the API key as every route but /health does, and reads no body (tools POST it empty, of any content type).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
from starlette.types import Receive, Send

from pdctl.router import jsonx
from pdctl.router.errors import error_body, send_bytes
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream.pools import Upstream
from pdctl.router.wire import RELEASED

log = logging.getLogger("pdctl.router")

PATH = "/reset_prefix_cache"
RESET = "reset"  # the release reason of the handles a reset drops
RELEASE_WAIT_S = 10.0  # how long the reset waits for the dropped handles' releases before it resets the engines
TIMEOUT_S = 30.0


async def reset_prefix_cache(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    released = sum(state.handles.drop_decode(u.url, RESET, RELEASED) for u in state.decode.members)
    pending = await _releases_done(state)
    pools = (state.decode,) if state.config.mode == "aggregated" else (state.prefill, state.decode)
    members = [(pool.role, u) for pool in pools for u in pool.members]
    results = await asyncio.gather(*(_reset(state, role, u) for role, u in members))
    failed = [r for r in results if r["status"] != 200]
    doc: dict[str, Any] = {"handles_released": released, "releases_pending": pending, "engines": results}
    log.info("[%s] prefix caches reset on %d of %d engines; %d handle(s) released", ctx.rid,
             len(results) - len(failed), len(results), released)
    if not failed:
        await send_bytes(send, 200, jsonx.dumps({"status": "ok", **doc}))
        return
    names = ", ".join(f"{r['role']} {r['url']} ({r['status'] or r['error']})" for r in failed)
    message = (f"prefix cache not reset on {names}: a vLLM engine serves {PATH} only with VLLM_SERVER_DEV_MODE=1 "
               "(pdctl's plan sets it; `pdctl up` again to apply)")
    err = jsonx.loads(error_body(502, message))
    await send_bytes(send, 502, jsonx.dumps({**err, "status": "failed", **doc}))


async def _releases_done(state: RouterState) -> int:
    """Wait until the releases in flight are done (their blocks freed before the engines reset), at most
    RELEASE_WAIT_S; the releases still pending then."""
    deadline = time.monotonic() + RELEASE_WAIT_S
    with state.releaser.urgent():  # none waits for a turn to carry it
        while state.releaser.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    return sum(state.releaser.pending.values())


async def _reset(state: RouterState, role: str, u: Upstream) -> dict[str, Any]:
    out: dict[str, Any] = {"role": role, "url": u.url, "status": 0}
    try:
        resp = await state.http.post(f"{u.url}{PATH}", content=b"", timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        out["error"] = type(exc).__name__
        return out
    out["status"] = resp.status_code
    return out
