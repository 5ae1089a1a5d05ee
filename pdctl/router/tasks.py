"""The router's timers: health checks that eject and re-admit upstreams, and the handle sweep."""

from __future__ import annotations

import asyncio
import logging

import httpx

from pdctl.router.state import RouterState
from pdctl.router.upstreams import Pool, Upstream

log = logging.getLogger("pdctl.router")


async def check(state: RouterState, pool: Pool, u: Upstream) -> None:
    was = u.healthy
    try:
        resp = await state.http.get(f"{u.url}/health", timeout=max(0.5, min(state.config.health_interval, 5.0)))
        ok = resp.status_code == 200
    except httpx.HTTPError:
        ok = False
    if ok:
        pool.succeeded(u)
    else:
        pool.failed(u)
    if was != u.healthy:
        log.warning("%s %s is %s", pool.role, u.url, "back in the pool" if u.healthy else "ejected (health check)")


async def check_all(state: RouterState) -> None:
    await asyncio.gather(*(check(state, pool, u) for pool in (state.prefill, state.decode) for u in pool.members))


async def health_loop(state: RouterState) -> None:
    while True:
        await check_all(state)
        await asyncio.sleep(state.config.health_interval)


async def sweep_loop(state: RouterState) -> None:
    while True:
        await asyncio.sleep(state.config.sweep_interval)
        n = state.handles.sweep()
        if n:
            log.info("dropped %d expired decode handle(s)", n)
