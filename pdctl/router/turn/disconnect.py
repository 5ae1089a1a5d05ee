"""Work that ends when its client leaves: the upstream calls of a request are cancelled on `http.disconnect`.

Cancelling closes the upstream connections (transport.py), which is how vLLM learns to abort a request, so an
abandoned request frees its engine slot on both hops, whether it streams or not, queued or running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.types import Message, Receive, Send


async def disconnected(receive: Receive) -> None:
    """Return once the client has gone (the request body must have been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(receive: Receive, send: Send, run: Callable[[Send], Coroutine[Any, Any, None]]) -> bool:
    """Run `run(send)` to its end, or cancel it when the client disconnects first; True when the client left.

    A disconnect after the response's last byte (or an SSE stream's `[DONE]`) is no reason to stop: what follows is
    the router's bookkeeping (the new handle), and uvicorn reports every completed response as disconnected.

    `run` runs in the caller's own task; one watcher task waits for the disconnect and cancels the caller's task
    (no second task for the work, no `asyncio.wait`: two tasks and a wait cost a streamed reply's worth of CPU).
    The cancellation is the watcher's only while `run` runs (`active`), and is taken back with `uncancel()`, so
    a cancellation from outside (the server stopping) still propagates."""
    answered = False
    active = True
    left = False
    me = asyncio.current_task()
    assert me is not None

    async def tracked(message: Message) -> None:
        nonlocal answered
        if message["type"] == "http.response.body" and (
                not message.get("more_body", False) or message.get("body", b"").endswith(b"data: [DONE]\n\n")):
            answered = True  # a client may hang up on [DONE], before the stream's empty last message
        await send(message)

    def gone(_: asyncio.Future[None]) -> None:
        nonlocal left
        if active and not answered and not left:
            left = True
            me.cancel()

    watcher = asyncio.ensure_future(disconnected(receive))
    watcher.add_done_callback(gone)
    try:
        await run(tracked)
    except asyncio.CancelledError:
        if not left or me.uncancel() > 0:  # not ours, or ours and another's: the caller is being cancelled
            raise
        return True
    finally:
        active = False
        watcher.remove_done_callback(gone)
        watcher.cancel()
    if left:  # `run` swallowed the cancellation and returned: the client left all the same
        me.uncancel()
        return True
    return False
