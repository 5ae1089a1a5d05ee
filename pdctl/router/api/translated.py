"""An agent-API request served as a chat completion: the ASGI `send` that renders the chat answer in the API's shape.

The Responses API and Anthropic Messages are translated into `/v1/chat/completions` for both P/D hops, so the one
path that carries the KV handshake (turn/pipeline.py) serves them. This wrapper sits between that path and the
client: it reads what the router would have sent (a whole chat body, an SSE stream of chat chunks, or an error),
turns it into chatstream events and lets the API's Renderer write them. The router's own headers (X-PD-*) pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from starlette.types import Message, Send

from pdctl.router import jsonx
from pdctl.router.api.chatstream import ChatReader, Event, reused_tokens
from pdctl.router.upstream.sse import SseEvents

SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class Renderer(Protocol):
    """One API's rendering of a turn; it accumulates events in both modes and emits bytes only when streaming."""

    reused: int

    def start(self) -> bytes: ...

    def feed(self, events: list[Event]) -> bytes: ...

    def end(self) -> bytes: ...

    def fail(self, message: str) -> bytes: ...

    def final(self) -> dict[str, Any]: ...

    def error_body(self, status: int, message: str, kind: str) -> bytes: ...


def error_parts(raw: bytes) -> tuple[str, str]:
    """(message, type) of an error body in OpenAI's shape, FastAPI's `detail`, or plain text."""
    try:
        obj = jsonx.loads(raw)
    except (jsonx.DecodeError, ValueError):
        return raw.decode("utf-8", "replace")[:2000] or "upstream error", "api_error"
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or "error"), str(err.get("type") or "api_error")
        if isinstance(err, str):
            return err, "api_error"
        if "detail" in obj:
            return str(obj["detail"]), "invalid_request_error"
    return raw.decode("utf-8", "replace")[:2000], "api_error"


class Translating:
    """The `send` given to pipeline.completion. After the call, `ok` says whether a whole answer reached the client.

    `kept` runs once a whole answer is rendered, before the client can see its end: what it stores (a Responses
    id) is there for a follow-up sent the instant this answer ended."""

    def __init__(self, send: Send, renderer: Renderer, kept: Callable[[], None] | None = None) -> None:
        self.send = send
        self.renderer = renderer
        self.kept = kept
        self.reader = ChatReader()
        self.status = 0
        self.streaming = False
        self.ok = False
        self._headers: list[tuple[bytes, bytes]] = []
        self._buf: list[bytes] = []
        self._sse = SseEvents()
        self._closed = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = list(message.get("headers", ()))
            ctype = next((v for k, v in headers if k == b"content-type"), b"")
            self._headers = [(k, v) for k, v in headers if k not in (b"content-length", b"content-type")]
            self.renderer.reused = reused_tokens(self._headers)
            self.streaming = self.status == 200 and ctype.startswith(b"text/event-stream")
            if self.streaming:
                await self.send({"type": "http.response.start", "status": 200, "headers": [*SSE, *self._headers]})
                await self.send({"type": "http.response.body", "body": self.renderer.start(), "more_body": True})
            return
        if message["type"] != "http.response.body":
            await self.send(message)
            return
        data: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if self.streaming:
            out = self._events(data, final=not more)
            self._kept()
            await self.send({"type": "http.response.body", "body": out, "more_body": more})
            return
        self._buf.append(data)
        if not more:
            status, body = self._whole(b"".join(self._buf))
            self._kept()
            raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   *self._headers]
            await self.send({"type": "http.response.start", "status": status, "headers": raw})
            await self.send({"type": "http.response.body", "body": body})

    def _kept(self) -> None:
        if self.ok and self.kept is not None:
            kept, self.kept = self.kept, None
            kept()

    def _whole(self, raw: bytes) -> tuple[int, bytes]:
        r = self.renderer
        if self.status == 200:
            try:
                obj = jsonx.loads(raw)
            except (jsonx.DecodeError, ValueError):
                obj = None
            if isinstance(obj, dict):
                r.feed(self.reader.whole(obj))
                self.ok = True
                return 200, jsonx.dumps(r.final())
            return 502, r.error_body(502, "the decode instance sent a body that is not JSON", "upstream_error")
        message, kind = error_parts(raw)
        return self.status, r.error_body(self.status, message, kind)

    def _events(self, data: bytes, final: bool) -> bytes:
        events = self._sse.feed(data)
        if final:
            events += self._sse.rest()
        out = [self._event(e) for e in events]
        if final and not self._closed:  # the stream ended without [DONE]: the client still gets a whole stream
            self._closed = True
            out.append(self.renderer.end())
            self.ok = True
        return b"".join(out)

    def _event(self, event: bytes) -> bytes:
        event = event.strip(b"\r\n")
        if self._closed or not event.startswith(b"data:"):
            return b""
        payload = event[5:].strip()
        if payload == b"[DONE]":
            self._closed = True
            self.ok = True
            return self.renderer.end()
        try:
            obj = jsonx.loads(payload)
        except (jsonx.DecodeError, ValueError):
            return b""
        if not isinstance(obj, dict):
            return b""
        if "error" in obj:
            self._closed = True
            message, _ = error_parts(payload)
            return self.renderer.fail(message)
        return self.renderer.feed(self.reader.chunk(obj))
