"""One whole request forwarded to one engine and its answer passed through: aggregated mode's engines
(aggregated.py) and a prefill serving a turn whole (overflow.py).

The answer passes through as the engine sent it (its body and status, never its headers or address), with the
caller's headers on a 200; only a derived conversation's reply is read on the side, to know its next request, and
the engine that served a conversation is recorded in the caller's table before the client sees the end.

An engine that refuses the connection, resets it or answers 5xx before the first byte never gave the client
anything: `attempt` returns the error and the caller tries another (or another way). One that fails mid-stream
ends the client's stream with an SSE error event and is ejected unless it was merely slow.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

import httpx
from starlette.types import Send

from pdctl.router import jsonx
from pdctl.router.errors import error_body, relayed_error, send_bytes
from pdctl.router.kv.affinity import AffinityTable
from pdctl.router.turn.capture import Capture
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.decode import SSE_HEADERS
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream import load
from pdctl.router.upstream.pools import Pool, Upstream
from pdctl.router.upstream.sse import SseEvents

log = logging.getLogger("pdctl.router")

ROLE = "engine"

@dataclass(frozen=True, slots=True)
class Via:
    """Where whole requests go: the pool, the table that remembers which of its engines served a conversation, and
    headers the client gets with a 200 (overflow.py serves turns whole on a prefill through here too)."""

    pool: Pool
    table: AffinityTable
    headers: tuple[tuple[bytes, bytes], ...] = ()




class _Reply:
    """What the engine answered, read on the side for a derived conversation (its next request is matched by
    it); for others it reads nothing. Records the engine for the conversation before the client sees the end."""

    def __init__(self, ctx: RequestContext, table: AffinityTable, u: Upstream) -> None:
        self.ctx, self.table, self.u = ctx, table, u
        self.derivation = ctx.derivation if ctx.conversation is not None else None
        self.capture = Capture(ctx.chat, keep_ids=True) if self.derivation is not None else None
        self.events = SseEvents()
        self.kept = False

    def whole(self, content: bytes) -> None:
        if self.capture is not None:
            try:
                obj = jsonx.loads(content)
            except (jsonx.DecodeError, ValueError):
                obj = None
            if isinstance(obj, dict):
                self.capture.take(obj, whole=True)
        self.keep()

    def chunk(self, data: bytes) -> None:
        """One chunk of a stream: the conversation is recorded at its first byte, a derived one's at its `[DONE]`."""
        if self.capture is None:
            self.keep()
            return
        for event in self.events.feed(data):
            event = event.strip(b"\r\n")
            payload = event[5:].strip() if event.startswith(b"data:") else b""
            if payload == b"[DONE]":
                self.keep()
            elif payload:
                try:
                    obj = jsonx.loads(payload)
                except (jsonx.DecodeError, ValueError):
                    continue
                if isinstance(obj, dict):
                    self.capture.take(obj)

    def keep(self) -> None:
        cid = self.ctx.conversation
        if self.kept or cid is None:
            return
        self.kept = True
        key = None
        if self.derivation is not None and self.capture is not None:
            key = self.derivation.reply_key(self.capture.reply(), self.capture.output_ids or None)
        self.table.put(cid, self.u, key)


class _InFlight:
    """The request counted on its engine (a request, its prompt tokens until the first byte) until `done()`, which
    runs once the engine has answered and before the client has the end: its next request sees the load as it is."""

    def __init__(self, u: Upstream, tokens: int) -> None:
        self.u, self.work = u, load.Work(u, tokens)
        u.outstanding += 1
        self.counted = True

    def done(self) -> None:
        self.work.done()
        if self.counted:
            self.counted = False
            self.u.outstanding -= 1


async def attempt(state: RouterState, ctx: RequestContext, via: Via, u: Upstream, send: Send, payload: bytes,
                  tokens: int) -> Literal[True] | bytes:
    """True once the client has its answer; else the failure's error body (nothing was sent), and the caller tries
    another engine."""
    busy = _InFlight(u, tokens)
    try:
        if ctx.body.get("stream"):
            return await _stream(state, ctx, via, busy, load.done_at_first_body(busy.work, send), payload)
        return await _whole(state, ctx, via, busy, send, payload)
    finally:
        busy.done()


def _headers(ctx: RequestContext) -> dict[str, str]:
    return {"content-type": "application/json", "x-request-id": ctx.rid}


def _failed(state: RouterState, ctx: RequestContext, via: Via, u: Upstream, kind: str,
            exc: Exception | None = None, status: int = 502, content: bytes = b"") -> bytes:
    state.metrics.error(u.role, kind)
    log.warning("[%s] %s %s failed before the first byte (%s)", ctx.rid, u.role, u.url, kind)
    if isinstance(exc, httpx.TimeoutException):
        via.pool.failed(u, slow=True)
    elif exc is not None:  # refused, reset or closed: the process may be gone
        via.pool.lost(u)
        via.pool.failed(u)
    if isinstance(exc, httpx.ConnectError):
        return error_body(502, "no engine could be reached")
    return relayed_error(status, content, ROLE) if content else error_body(status, f"the engine failed ({kind})")


def _kind(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return "connect" if isinstance(exc, httpx.ConnectError) else "read"


async def _whole(state: RouterState, ctx: RequestContext, via: Via, busy: _InFlight, send: Send,
                 payload: bytes) -> Literal[True] | bytes:
    u = busy.u
    try:
        resp = await state.http.post(f"{u.url}{ctx.path}", content=payload, headers=_headers(ctx))
    except httpx.HTTPError as exc:
        return _failed(state, ctx, via, u, _kind(exc), exc)
    busy.done()
    if resp.status_code >= 500:
        return _failed(state, ctx, via, u, f"http_{resp.status_code}", content=resp.content)
    via.pool.succeeded(u)
    if resp.status_code != 200:
        await send_bytes(send, resp.status_code, relayed_error(resp.status_code, resp.content, ROLE))
        return True
    _Reply(ctx, via.table, u).whole(resp.content)
    ctype = resp.headers.get("content-type", "application/json").encode("latin-1")
    await send_bytes(send, 200, resp.content, via.headers, content_type=ctype)
    return True


async def _stream(state: RouterState, ctx: RequestContext, via: Via, busy: _InFlight, send: Send,
                  payload: bytes) -> Literal[True] | bytes:
    u = busy.u
    try:
        resp = await state.http.stream_post(f"{u.url}{ctx.path}", payload, _headers(ctx))
    except httpx.HTTPError as exc:
        return _failed(state, ctx, via, u, _kind(exc), exc)
    try:
        return await _relay(state, ctx, via, busy, send, resp)
    finally:
        await resp.aclose()


async def _relay(state: RouterState, ctx: RequestContext, via: Via, busy: _InFlight, send: Send,
                 resp: httpx.Response) -> Literal[True] | bytes:
    u = busy.u
    if resp.status_code != 200:
        try:
            content = await resp.aread()
        except httpx.HTTPError as exc:
            return _failed(state, ctx, via, u, _kind(exc), exc)
        if resp.status_code >= 500:
            return _failed(state, ctx, via, u, f"http_{resp.status_code}", content=content)
        await send_bytes(send, resp.status_code, relayed_error(resp.status_code, content, ROLE))
        return True
    chunks = resp.aiter_raw()
    try:
        first = await chunks.__anext__()
    except StopAsyncIteration:
        return _failed(state, ctx, via, u, "empty_stream")
    except httpx.HTTPError as exc:
        return _failed(state, ctx, via, u, _kind(exc), exc)
    via.pool.succeeded(u)
    reply = _Reply(ctx, via.table, u)
    await send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *via.headers]})
    state.metrics.ttft_seconds.observe(time.perf_counter() - ctx.started)
    try:
        data = first
        while True:
            reply.chunk(data)
            await send({"type": "http.response.body", "body": data, "more_body": True})
            data = await chunks.__anext__()
    except StopAsyncIteration:
        tail = b""
    except httpx.HTTPError as exc:
        slow = isinstance(exc, httpx.TimeoutException)
        if not slow:
            via.pool.eject(u)
        state.metrics.error(u.role, "mid_stream_timeout" if slow else "mid_stream")
        log.error("[%s] %s %s failed mid-stream (%s)%s", ctx.rid, u.role, u.url, type(exc).__name__,
                  "" if slow else "; ejected it from the pool")
        reply.kept = True  # the conversation's reply is not whole: its next request will not match it
        tail = b"data: " + error_body(502, "the engine failed mid-stream") + b"\n\ndata: [DONE]\n\n"
    reply.keep()
    busy.done()
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    return True

