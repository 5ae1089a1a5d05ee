"""A lean HTTP/1.1 keep-alive transport for httpx clients on a hot path: asyncio protocols + httptools.

httpx's default transport (httpcore on anyio) costs several hundred microseconds of CPU per request (its pool
checks every idle connection's socket before each request). Two clients cannot afford that: the router, which
makes two or three upstream calls per client request and must add well under a millisecond, and the simulated
engines' side channel, which stands in for NIXL (whose reads cost no Python) and makes a call per pulled request.
This transport speaks only what they need (plain http, HTTP/1.1, keep-alive, streamed bodies) and still presents
the httpx interface, so the rest of the code and the tests are unchanged; pass another transport to opt out.
It imports nothing of pdctl: the router uses it as a leaf, the simulator (which stands apart) as its one exception
besides prefix_check.
"""

from __future__ import annotations

import asyncio
from collections import deque

import httptools
import httpx

Key = tuple[str, int]


class _Conn(asyncio.Protocol):
    def __init__(self, pool: FastTransport, key: Key) -> None:
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        # The loop, once: asyncio.get_running_loop() makes a getpid() system call on each call (Python 3.11).
        self.loop = asyncio.get_running_loop()
        self.reset()

    def reset(self) -> None:
        self.released = False
        self.keep_alive = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.head: asyncio.Future[None] = self.loop.create_future()
        self.chunks: deque[bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.done = False
        self.error: Exception | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"bad response from upstream: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done:
            self._fail(httpx.ReadError("upstream closed the connection"))
        self.pool.discard(self)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # httptools forgets it once the message completes
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self.error = exc
        if not self.head.done():
            self.head.set_exception(exc)
            self.head.exception()  # retrieved: nobody may await the head of a connection that died idle
        self._wake()
        if self.transport is not None:
            self.transport.close()

    async def next_chunk(self, timeout: float | None) -> bytes | None:
        """The body's bytes that have arrived since the last call (waiting for some if none have), joined: a
        burst of upstream chunks read in one go (the decode wrote several events at once, or the router was busy)
        is passed on as one; None at the body's end."""
        while True:
            if self.chunks:  # all that is already here, as one: one rewrite and one client write, not one each
                if len(self.chunks) == 1:
                    return self.chunks.popleft()
                joined = b"".join(self.chunks)
                self.chunks.clear()
                return joined
            if self.done:
                return None
            if self.error is not None:
                raise self.error
            self.waiter = self.loop.create_future()
            await _wait(self.loop, self.waiter, timeout, "upstream sent nothing in time")


def _write(conn: _Conn, payload: bytes) -> None:
    """Send a request; a transport that died under us (uvloop raises RuntimeError, asyncio OSError) is a
    closed connection, which the caller retries like any other."""
    if conn.transport is None or conn.transport.is_closing():
        raise httpx.ReadError("upstream closed the connection")
    try:
        conn.transport.write(payload)
    except (RuntimeError, OSError) as exc:
        raise httpx.ReadError(f"upstream connection is closed: {exc}") from None


def _close(conn: _Conn) -> None:
    """Close a connection whose exchange is abandoned: the upstream sees the disconnect and aborts its work."""
    conn.released = True
    if conn.transport is not None:
        conn.transport.close()


async def _wait(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None], timeout: float | None,
                message: str) -> None:
    """Await `fut`, failing it with httpx.ReadTimeout after `timeout` s (a timer, cheaper than wait_for)."""
    if timeout is None:
        await fut
        return

    def expire() -> None:
        if not fut.done():
            fut.set_exception(httpx.ReadTimeout(message))

    timer = loop.call_later(timeout, expire)
    try:
        await fut
    finally:
        timer.cancel()


class Body(httpx.AsyncByteStream):
    """The response body: its own async iterator, not an async generator (each of those is registered with the
    event loop's asyncgen hooks, a WeakSet add and remove per response). A read that fails or is cancelled closes
    the connection; one abandoned part way is closed by aclose() (`release` keeps only a connection read whole)."""

    def __init__(self, conn: _Conn, timeout: float | None) -> None:
        self.conn, self.timeout = conn, timeout

    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self.conn.next_chunk(self.timeout)
        except BaseException:
            _close(self.conn)
            raise
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        self.conn.pool.release(self.conn)


class FastTransport(httpx.AsyncBaseTransport):
    def __init__(self, max_idle: int = 512) -> None:
        self.max_idle = max_idle
        self._idle: dict[Key, list[_Conn]] = {}

    async def _connect(self, key: Key, timeout: float | None, reuse: bool = True) -> tuple[_Conn, bool]:
        idle = self._idle.get(key)
        while reuse and idle:
            conn = idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                conn.reset()
                return conn, True
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(lambda: _Conn(self, key), *key), timeout)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {key[0]}:{key[1]} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc.strerror}") from None
        return conn, False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol("the fast transport speaks plain http only")
        timeouts = request.extensions.get("timeout", {})
        body = request.content
        lines = [request.method.encode(), b" ", url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            if name.lower() not in (b"content-length", b"transfer-encoding"):
                lines += [name, b": ", value, b"\r\n"]
        lines += [b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body]
        status, headers, stream = await self.exchange((url.host, url.port or 80), b"".join(lines),
                                                      timeouts.get("connect"), timeouts.get("read"))
        return httpx.Response(status, headers=headers, stream=stream, extensions={"http_version": b"HTTP/1.1"})

    async def exchange(self, key: Key, payload: bytes, connect_timeout: float | None,
                       read_timeout: float | None) -> tuple[int, list[tuple[bytes, bytes]], Body]:
        """Send one whole request (`payload`: its head and body) and wait for the response's head: its status,
        headers and body stream (whose aclose() puts the connection back). LeanClient calls this directly."""
        for fresh in (False, True):
            conn, reused = await self._connect(key, connect_timeout, reuse=not fresh)
            try:
                _write(conn, payload)
                await _wait(conn.loop, conn.head, read_timeout, "upstream sent no response in time")
                break
            except httpx.ReadError:
                # A pooled keep-alive connection the upstream closed just now: retry once on a new one.
                _close(conn)
                if not reused or conn.headers:
                    raise
            except BaseException:  # timeouts, protocol errors, and the caller's cancellation (its client left)
                _close(conn)
                raise
        return conn.parser.get_status_code(), conn.headers, Body(conn, read_timeout)

    def release(self, conn: _Conn) -> None:
        if conn.released or conn.transport is None or conn.transport.is_closing():
            return
        conn.released = True
        if not conn.done or not conn.keep_alive:
            conn.transport.close()
            return
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.transport.close()

    def discard(self, conn: _Conn) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()
