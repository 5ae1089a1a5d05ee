"""Requests whose client left: the work is cancelled, as vLLM aborts a request whose client disconnected."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from pdctl.sim.engine import Run

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def collect(run: Run) -> list[int]:
    return [t async for t in run.tokens()]


async def unless_gone(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await `work`, cancelling it (and raising ClientGone) if the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGone
