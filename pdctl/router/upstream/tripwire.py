"""A tripwire per decode: one idle TCP connection the router holds open and never uses.

A process that dies closes every socket it had, so the tripwire closing means the decode behind that address may
be a new process, even one restarted on the same port between two health checks (a simulator restarts in 0.3 s,
faster than the default 2 s interval). Its handles then point at KV that no longer exists: the decode's
generation ends at once (pools.py) and nothing it issued before is used. A refused reconnect means the same.
Only plain-http decodes get one (a TLS server would time out the silent handshake and trip it for nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx

from pdctl.router.upstream.pools import Pool, Upstream

log = logging.getLogger("pdctl.router")


async def watch(pool: Pool, u: Upstream, retry_s: float) -> None:
    url = httpx.URL(u.url)
    if url.scheme != "http":
        return
    host, port = url.host, url.port or 80
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            pool.lost(u)  # refused: whatever answers next is not known to be the process that issued the handles
            await asyncio.sleep(retry_s)
            continue
        try:
            with contextlib.suppress(OSError):
                await reader.read()  # returns at EOF or raises on reset: the process closed it, i.e. died
        finally:
            writer.close()
        pool.lost(u)
        log.warning("%s %s closed the router's tripwire connection: it may have restarted; its handles are dropped",
                    pool.role, u.url)
