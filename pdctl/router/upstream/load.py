"""What the router has in flight on each engine: requests (`Upstream.outstanding`) and prompt tokens not yet computed
there (`Upstream.work`), counted while a turn's prompt is computed. Placement (turn/placement.py) weighs them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from starlette.types import Message, Send

from pdctl.router.upstream.pools import Upstream


@dataclass(frozen=True)
class Load:
    """What the router has in flight on one instance: requests, and prompt tokens not yet computed there."""

    requests: int
    tokens: int = 0


def load_of(u: Upstream) -> Load:
    return Load(u.outstanding, u.work)


class Work:
    """Prompt tokens counted on an instance while it computes them: added now, taken off by `done()` (once)."""

    def __init__(self, u: Upstream, tokens: int) -> None:
        self.u, self.tokens = u, max(tokens, 0)
        u.work += self.tokens

    def done(self) -> None:
        if self.tokens:
            self.u.work -= self.tokens
            self.u.work_done_at = time.perf_counter()
        self.tokens = 0


def done_at_first_body(work: Work, send: Send) -> Send:
    """`send`, marking `work` done at the first body bytes to the client: a turn's prompt is computed when its
    first token leaves (for a local turn on a decode; its later tokens are decode steps)."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.body" and (message.get("body") or not message.get("more_body")):
            work.done()
        await send(message)

    return wrapped
