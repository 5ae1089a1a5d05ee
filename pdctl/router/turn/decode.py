"""The decode hop: stream through as bytes arrive, capture the decode's new handle, never leak internals.

The client's response starts only with the decode's first body bytes, so a decode that fails before then is
retried. A decode that refused the connection never saw the request: another decode gets the same prefill
params. Any other failure before the first byte (an error answer, a reset, a timeout) may have spent the
prefill's KV, or is the prefill's fault (a failed KV pull from a dead prefill): the result says `redo`, and the
caller runs the prefill again, never blaming the decode. Only refused connections and deaths count against a
decode's health. One that fails mid-stream ends the client's stream with an SSE error event; it is ejected
unless it was merely slow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from starlette.types import Receive, Send

from pdctl.router import jsonx, wire
from pdctl.router.errors import error_body, relayed_error, send_bytes
from pdctl.router.turn.capture import Capture, SseRewriter
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.state import RouterState
from pdctl.router.turn.trace import CLIENT
from pdctl.router.upstream.client import raw_chunks
from pdctl.router.upstream.pools import Upstream

log = logging.getLogger("pdctl.router")

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
MAX_ATTEMPTS = 3

# What the caller does with a decode's answer once it is whole (the new handle), before the client can see its end.
Done = Callable[[Capture, Upstream], None]


@dataclass
class DecodeResult:
    capture: Capture | None
    upstream: Upstream | None
    sent: bool  # whether the client got a response (success or a relayed error)
    redo: bool = False  # failed before the first byte, not for want of a decode: run the prefill again
    error: bytes = b""  # the last failure as an OpenAI error body, for the client if nothing else works


@dataclass
class _Failed:
    redo: bool
    error: bytes


def decode_body(body: dict[str, Any], params: dict[str, Any] | None) -> bytes:
    out = dict(body)
    out["return_token_ids"] = True
    if params is not None:
        out["kv_transfer_params"] = params
    return jsonx.dumps(out)


async def run(
    state: RouterState, ctx: RequestContext, receive: Receive, send: Send, params: dict[str, Any] | None,
    headers: list[tuple[bytes, bytes]], done: Done | None = None, only: Upstream | None = None,
) -> DecodeResult:
    """Stream the decode's answer to the client, preferring the decode that holds the conversation's KV; `only`
    tries that one decode and no other (a local turn).

    `done`, if given, runs once, before the message that ends the client's response (`[DONE]`, a whole body, a relayed
    error): a client that sends its next turn the instant it has read this one's end finds the bookkeeping done,
    even when the decode's own stream closes later."""
    body, holder = ctx.body, ctx.holder
    payload = decode_body(body, params)
    stream = bool(body.get("stream"))
    keep_ids = bool(body.get("return_token_ids"))
    tried: list[Upstream] = []
    last = _Failed(False, b"")
    for _ in range(1 if only else MAX_ATTEMPTS):
        d = only or state.decode_policy.pick(state.decode, holder, exclude=tried)
        if d is None:
            break
        tried.append(d)
        capture = Capture(ctx.chat, keep_ids, ctx.cached_tokens, ctx.cached_default)
        finish = _once(done, capture, d)
        d.outstanding += 1
        try:
            if stream:
                out = await _stream(state, ctx, d, receive, send, payload, capture, headers, finish)
            else:
                out = await _whole(state, ctx, d, send, payload, capture, headers, finish)
        finally:
            d.outstanding -= 1
        if not isinstance(out, _Failed):
            finish()  # the client left mid-stream: nothing ended its response
            return DecodeResult(capture, d, True)
        last = out
        if out.redo:
            return DecodeResult(None, d, False, True, out.error)
    return DecodeResult(None, None, False, False, last.error)


def _once(done: Done | None, capture: Capture, d: Upstream) -> Callable[[], None]:
    """`done` for this attempt's answer, run at most once: a stream's `[DONE]` and its end both call it."""
    pending = [done] if done is not None else []

    def finish() -> None:
        while pending:
            pending.pop()(capture, d)
    return finish


def _fail(state: RouterState, d: Upstream, rid: str, kind: str, exc: Exception | None = None,
          status: int = 502, content: bytes = b"") -> _Failed:
    """Account for a failure before the first byte: refused -> try another decode; anything else -> redo."""
    state.metrics.error("decode", kind)
    if isinstance(exc, httpx.ConnectError):
        state.decode.lost(d)
        state.decode.failed(d)
        log.warning("[%s] decode refused the connection (%s); trying another decode", rid, exc)
        return _Failed(False, error_body(502, "no decode instance could be reached"))
    if isinstance(exc, httpx.TimeoutException):
        state.decode.failed(d, slow=True)
    elif exc is not None:  # reset or closed: the process may be gone
        state.decode.lost(d)
        state.decode.failed(d)
    log.warning("[%s] decode failed before the first byte (%s); running the prefill again", rid, kind)
    body = relayed_error(status, content, "decode") if content else error_body(status, f"the decode failed ({kind})")
    return _Failed(True, body)


def _kind(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return "connect" if isinstance(exc, httpx.ConnectError) else "read"


async def _whole(state: RouterState, ctx: RequestContext, d: Upstream, send: Send, payload: bytes,
                 capture: Capture, headers: Iterable[tuple[bytes, bytes]],
                 finish: Callable[[], None]) -> Literal[True] | _Failed:
    rid = ctx.rid
    span = ctx.trace.new_id() if ctx.trace is not None else None
    sent = ctx.decode_sent = time.perf_counter()
    try:
        resp = await state.http.post(f"{d.url}{ctx.path}", content=payload, headers=_request_headers(ctx, span))
    except httpx.HTTPError as exc:
        return _fail(state, d, rid, _kind(exc), exc)
    decode_ms = _decode_ms(sent)
    _traced(ctx, d, sent, span, payload, resp.status_code)
    if resp.status_code >= 500:
        return _fail(state, d, rid, f"http_{resp.status_code}", content=resp.content)
    state.decode.succeeded(d)
    content = resp.content
    if resp.status_code == 200:
        try:
            obj = jsonx.loads(content)
        except jsonx.DecodeError:
            return _fail(state, d, rid, "bad_json")
        if isinstance(obj, dict):
            capture.take(obj, whole=True)
            content = jsonx.dumps(obj)
    else:
        content = relayed_error(resp.status_code, content, "decode")
    finish()
    ctx.first_byte = time.perf_counter()
    await send_bytes(send, resp.status_code, content, [*headers, decode_ms])
    return True


def _request_headers(ctx: RequestContext, span: bytes | None) -> dict[str, str]:
    headers = {"content-type": "application/json", "x-request-id": ctx.rid}
    if ctx.trace is not None and span is not None:
        headers["traceparent"] = ctx.trace.traceparent(span)[1].decode()
    return headers


def _traced(ctx: RequestContext, d: Upstream, sent: float, span: bytes | None, payload: bytes, status: int) -> None:
    """The decode stage (request to first byte) and, when it pulled the prefill's KV, the P->D pull inside it."""
    tr = ctx.trace
    if tr is None or span is None:
        return
    now = time.perf_counter()
    pulled = b'"kv_transfer_params"' in payload
    tr.span("decode", sent, now, kind=CLIENT, span_id=span, error=status >= 500,
            attrs={"server.address": d.url, "http.response.status_code": status,
               "pdctl.placement": "disaggregated" if pulled else "decode_alone"})
    if pulled:
        tr.span("kv.pull p->d", sent, now, parent=span,
                attrs={"pdctl.kv.direction": wire.P_TO_D, "pdctl.timing": "the decode's first byte"})


def _decode_ms(sent: float) -> tuple[bytes, bytes]:
    """The decode stage: request sent to first byte (its KV pull, its first step), or to the whole body."""
    return wire.raw_ms(wire.DECODE_MS_HEADER, (time.perf_counter() - sent) * 1000)


async def _stream(state: RouterState, ctx: RequestContext, d: Upstream, receive: Receive, send: Send, payload: bytes,
                  capture: Capture, headers: list[tuple[bytes, bytes]],
                  finish: Callable[[], None]) -> Literal[True] | _Failed:
    rid = ctx.rid
    span = ctx.trace.new_id() if ctx.trace is not None else None
    sent = ctx.decode_sent = time.perf_counter()
    try:
        resp = await state.http.stream_post(f"{d.url}{ctx.path}", payload, _request_headers(ctx, span))
    except httpx.HTTPError as exc:
        return _fail(state, d, rid, _kind(exc), exc)
    try:
        if resp.status_code != 200:
            try:
                content = await resp.aread()
            except httpx.HTTPError as exc:
                return _fail(state, d, rid, _kind(exc), exc)
            if resp.status_code >= 500:
                return _fail(state, d, rid, f"http_{resp.status_code}", content=content)
            finish()
            await send_bytes(send, resp.status_code, relayed_error(resp.status_code, content, "decode"), headers)
            return True
        chunks = raw_chunks(resp)
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            return _fail(state, d, rid, "empty_stream")
        except httpx.HTTPError as exc:
            return _fail(state, d, rid, _kind(exc), exc)
        state.decode.succeeded(d)
        _traced(ctx, d, sent, span, payload, 200)
        sse = SseRewriter(capture)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*SSE_HEADERS, *headers, _decode_ms(sent)]})
        last = sse.feed(first)  # held back once it carries `[DONE]`: it goes out with the end of the response
        ctx.first_byte = time.perf_counter()
        state.metrics.ttft_seconds.observe(ctx.first_byte - ctx.started)
        if not sse.done:  # a whole answer in the first read (the common short reply) needs no disconnect watch
            gone = asyncio.ensure_future(_disconnected(receive))
            try:
                if last:
                    await send({"type": "http.response.body", "body": last, "more_body": True})
                last = b""
                prev, gap = ctx.first_byte, 0.0
                async for chunk in chunks:
                    if gone.done():  # the client left: closing the response makes the decode abort the request
                        capture.params = None
                        log.info("[%s] client disconnected; aborting the decode", rid)
                        return True
                    now = time.perf_counter()
                    if now - prev > gap and d.work == 0 and prev > d.work_done_at:
                        gap = now - prev  # a gap no local prompt on this decode stalled: what its streams see anyway
                    prev = now
                    out = sse.feed(chunk)
                    if sse.done:  # the decode's answer is whole: its stream may still take a while to close
                        last = out
                        break
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                last += sse.flush()
                _stepped(state, d, ctx.first_byte, len(capture.output_ids), gap)
            except httpx.HTTPError as exc:
                slow = isinstance(exc, httpx.TimeoutException)
                if not slow:
                    state.decode.eject(d)
                state.metrics.error("decode", "mid_stream_timeout" if slow else "mid_stream")
                log.error("[%s] decode failed mid-stream (%s)%s", rid, type(exc).__name__,
                          "" if slow else "; ejected it from the pool")
                capture.params = None
                last = b"data: " + error_body(502, "the decode instance failed mid-stream") + b"\n\ndata: [DONE]\n\n"
            finally:
                gone.cancel()
        else:
            last += sse.flush()
        finish()
        await send({"type": "http.response.body", "body": last, "more_body": False})
        if sse.done:  # read the stream's end, so that its connection goes back to the pool
            with contextlib.suppress(httpx.HTTPError):
                async for _ in chunks:
                    pass
        return True
    finally:
        await resp.aclose()


def _stepped(state: RouterState, d: Upstream, first: float, tokens: int, gap_s: float) -> None:
    """A whole stream's inter-token latency as relayed, and its largest gap between two chunks that no local
    prompt stalled (0: none such), for the decode's step and gap at the streams it has in flight (the cost
    model's; turn/rates.py)."""
    if tokens >= 3:
        state.rates.stepped(d.url, d.generation, d.outstanding, (time.perf_counter() - first) * 1000 / (tokens - 1),
                            gap_s * 1000)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
