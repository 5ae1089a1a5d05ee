"""The router's timers: health checks that eject and re-admit upstreams, and the handle sweep."""

from __future__ import annotations

import asyncio
import logging

import httpx

from pdctl.router.turn.state import RouterState
from pdctl.router.upstream.pools import Pool, Upstream

log = logging.getLogger("pdctl.router")


async def check(state: RouterState, pool: Pool, u: Upstream) -> None:
    """One health check. A timeout is slowness (the process may be alive and busy); refused, reset or an error
    status is a process that may have died, so it also ends the instance's generation (its handles go)."""
    was = u.healthy
    slow = False
    try:
        resp = await state.http.get(f"{u.url}/health", timeout=state.config.health_timeout)
        ok = resp.status_code == 200
    except httpx.ReadTimeout:
        ok, slow = False, True
    except httpx.HTTPError:
        ok = False
    if ok:
        pool.succeeded(u)
    else:
        if not slow:
            pool.lost(u)
        pool.failed(u, slow=slow)
    if was != u.healthy:
        log.warning("%s %s is %s", pool.role, u.url, "back in the pool" if u.healthy else "ejected (health check)")


async def check_all(state: RouterState) -> None:
    await asyncio.gather(*(check(state, pool, u) for pool in (state.prefill, state.decode) for u in pool.members))
    state.prefill_gate.wake()
    state.decode_gate.wake()


async def health_loop(state: RouterState) -> None:
    while True:
        await check_all(state)
        await asyncio.sleep(state.config.health_interval)


async def sweep_loop(state: RouterState) -> None:
    while True:
        await asyncio.sleep(state.config.sweep_interval)
        n = state.handles.sweep(state.stale)
        if n:
            log.info("dropped %d expired or orphaned decode handle(s)", n)
