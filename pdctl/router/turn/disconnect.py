"""Work that ends when its client leaves: the upstream calls of a request are cancelled on `http.disconnect`.

Cancelling closes the upstream connections (transport.py), which is how vLLM learns to abort a request, so an
abandoned request frees its engine slot on both hops, whether it streams or not, queued or running.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    the router's bookkeeping (the new handle), and uvicorn reports every completed response as disconnected."""
    answered = False

    async def tracked(message: Message) -> None:
        nonlocal answered
        if message["type"] == "http.response.body" and (
                not message.get("more_body", False) or message.get("body", b"").endswith(b"data: [DONE]\n\n")):
            answered = True  # a client may hang up on [DONE], before the stream's empty last message
        await send(message)

    task = asyncio.ensure_future(run(tracked))
    gone = asyncio.ensure_future(disconnected(receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        if task.done() or answered:
            await task
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return True
    finally:
        gone.cancel()
        if not task.done():  # we were cancelled ourselves
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
