"""The router's retention tasks (pdctl.router.kv.retention): at start, the pin journal is opened and what earlier
routers of the deployment left is released; then each decode's KV is polled and judged, and the journal flushed."""

from __future__ import annotations

import asyncio
import logging

from pdctl.errors import UsageError
from pdctl.router.turn.state import RouterState

log = logging.getLogger("pdctl.router")


def start(state: RouterState) -> list[asyncio.Task[None]]:
    r, cfg = state.retention, state.config
    tasks = [asyncio.create_task(r.loop(state.http, cfg.health_timeout))]
    if r.journal is not None:
        try:
            taken = r.journal.open()
        except OSError as exc:
            raise UsageError(f"--state-dir {cfg.state_dir}: cannot keep the pin journal there ({exc})",
                             hint="give a directory this user can write, or leave --state-dir out") from None
        log.info("pin journal: %s", r.journal.path)
        r.reclaim(taken)
        tasks.append(asyncio.create_task(r.flush_loop()))
    return tasks
