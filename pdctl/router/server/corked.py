"""A response's writes in one event-loop step, sent to the client socket as one write.

uvicorn writes each ASGI message to the socket at once: a streamed reply's head and its first events, sent one
after the other with nothing awaited between them, are two `write()` system calls, and a short reply (the head,
then the whole body) is two as well. On the router's core the event loop's own work (these system calls, the
reads, the polls) costs more than the Python that decides what to send, so the calls are what to cut.

Here a response's writes go to a `Cork`: the first in a step schedules a flush for the end of that step
(`call_soon`), later ones join it; the response's last message flushes at once. Nothing waits for bytes that are
not there yet: what an application sends is on the socket before the event loop polls again, in the order sent.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

if TYPE_CHECKING:
    from uvicorn._types import ASGISendEvent


class Cork:
    """The write side of an asyncio transport, holding a step's writes until its end (or `flush`)."""

    __slots__ = ("loop", "parts", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport, self.loop = transport, loop
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self.parts:
            self.loop.call_soon(self.flush)
        self.parts.append(data)

    def flush(self) -> None:
        parts = self.parts
        if not parts:
            return
        self.parts = []
        if not self.transport.is_closing():  # the client left: uvicorn drops what is sent after that too
            self.transport.write(parts[0] if len(parts) == 1 else b"".join(parts))

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


class CorkedCycle(RequestResponseCycle):
    """uvicorn's request/response cycle, its writes through a Cork; the response's end is written at once."""

    async def send(self, message: ASGISendEvent) -> None:
        await super().send(message)
        if self.response_complete:
            cast(Cork, self.transport).flush()


def cork(cycle: RequestResponseCycle, loop: asyncio.AbstractEventLoop) -> None:
    """Make a new, not yet started cycle write through a Cork (its task resolves `send` when it first runs)."""
    if type(cycle) is RequestResponseCycle:
        cycle.__class__ = CorkedCycle
        cycle.transport = cast(asyncio.Transport, Cork(cycle.transport, loop))
