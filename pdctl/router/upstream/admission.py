"""Admission control for one pool: a bound on requests in flight, a FIFO queue with a deadline, a fast refusal.

At most `per_instance` x (healthy instances) requests hold a slot of the pool at once; the next ones wait in
line, at most `max_queue` of them and at most `timeout` seconds each. A full queue answers 429 at once and a
wait past the deadline 503, both with `Retry-After`, so overload is shed at the door instead of becoming health
check timeouts and ejections. A waiter whose client left is cancelled, so it never reaches an engine.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from starlette.types import Send

from pdctl.router.errors import send_error
from pdctl.router.upstream.pools import Pool

RETRY_AFTER_S = 1


class Overloaded(Exception):
    """No slot: `status` 429 (the queue is full) or 503 (the wait ran past the deadline)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Gate:
    def __init__(self, pool: Pool, per_instance: int, max_queue: int, timeout: float,
                 on_refused: Callable[[str, int], None] | None = None) -> None:
        self.pool = pool
        self.on_refused = on_refused  # (role, status) of each refusal: the router's metrics
        self.per_instance = per_instance
        self.max_queue = max_queue
        self.timeout = timeout
        self.inflight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def _refused(self, status: int) -> None:
        if self.on_refused is not None:
            self.on_refused(self.pool.role, status)

    def capacity(self) -> int:
        return self.per_instance * max(1, len(self.pool.healthy()))

    async def acquire(self) -> None:
        if self.inflight < self.capacity() and not self._waiters:
            self.inflight += 1
            return
        role = self.pool.role
        if len(self._waiters) >= self.max_queue:
            self._refused(429)
            raise Overloaded(429, f"the router is at capacity for its {role} instances ({self.inflight} requests "
                             f"in flight, {len(self._waiters)} queued); retry after {RETRY_AFTER_S}s")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.append(fut)

        def expire() -> None:
            if not fut.done():
                self._refused(503)
                fut.set_exception(Overloaded(503, f"no {role} slot came free within {self.timeout:g}s "
                                             f"(--queue-timeout); retry after {RETRY_AFTER_S}s"))

        timer = loop.call_later(self.timeout, expire)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release()  # a slot was handed over just as this waiter left: pass it on
            raise
        finally:
            timer.cancel()
            if fut in self._waiters:
                self._waiters.remove(fut)

    async def admit(self, send: Send, headers: list[tuple[bytes, bytes]] | None = None) -> bool:
        """A slot, or False when refused: the 429/503 with Retry-After (and `headers`) is then sent on `send`."""
        try:
            await self.acquire()
        except Overloaded as e:
            retry = [(b"retry-after", str(RETRY_AFTER_S).encode()), *(headers or ())]
            await send_error(send, e.status, e.message, retry)
            return False
        return True

    def release(self) -> None:
        self.inflight -= 1
        self.wake()

    def wake(self) -> None:
        """Hand free slots to the longest waiters (also after instances rejoin the pool)."""
        while self._waiters and self.inflight < self.capacity():
            fut = self._waiters.popleft()
            if not fut.done():
                self.inflight += 1
                fut.set_result(None)
