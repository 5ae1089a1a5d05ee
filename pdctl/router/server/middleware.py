"""Small stateless ASGI middlewares; per-request state lives on the request's RequestContext (context.py).

RequestId   gives every request its context: an id, echoed as `X-Request-Id`, and its route (routes.py), and counts
            it by route and status
ApiKey      `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on every route that asks for it, when a
            key is configured
JsonBody    POST bodies: JSON content type (415), read within a deadline (408), size limit (413), a JSON
            object no deeper than MAX_DEPTH (400), client `kv_transfer_params` removed, `conversation_id`
            taken out; the parsed body is left on the context
Http10      HTTP/1.0 clients cannot read chunked replies: their response is sent whole, with content-length
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pdctl.router import jsonx
from pdctl.router.errors import send_error
from pdctl.router.turn.context import NO_BODY, SCOPE_KEY, RequestContext
from pdctl.router.turn.metrics import RouterMetrics

if TYPE_CHECKING:
    from pdctl.router.server.routes import RouteTable

log = logging.getLogger("pdctl.router")


class RequestId:
    def __init__(self, app: ASGIApp, metrics: RouterMetrics, routes: RouteTable) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path = scope["path"]
        ctx = RequestContext(os.urandom(16).hex(), t0, scope["method"], path, scope["headers"],
                             scope.get("query_string", b""), self.routes.match(path), NO_BODY)
        scope[SCOPE_KEY] = ctx
        header = (b"x-request-id", ctx.rid.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                ctx.status = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.metrics.request(self.routes.label(ctx.route), ctx.status)


class ApiKey:
    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope[SCOPE_KEY].route
        if route is not None and not route.auth:
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if not given:
            given = b"Bearer " + next((v for k, v in scope["headers"] if k == b"x-api-key"), b"")
        if not hmac.compare_digest(given, self.expected):
            await send_error(send, 401, "missing or invalid API key: send `Authorization: Bearer <key>` "
                             "(or `x-api-key: <key>`)",
                             headers=[(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


# orjson writes at most 254 levels; real requests (tool schemas included) stay far below this.
MAX_DEPTH = 128


_CONTAINERS = frozenset({dict, list})  # what JSON parses into; a subclass never comes out of a parser


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `obj` nests containers deeper than `limit` (iterative: cost is the number of containers)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, list) and not _CONTAINERS & set(map(type, item)):
            continue  # a list of scalars (25k token ids): one pass in C, not an isinstance() per element
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def json_media(value: bytes | None) -> bool:
    """A JSON content type, or none at all (curl without -H); forms and text/plain are a browser's CSRF path."""
    if value is None:
        return True
    media = value.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class JsonBody:
    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout: float = 60.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout = read_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = scope[SCOPE_KEY].route if scope["type"] == "http" else None
        if scope["type"] != "http" or scope["method"] != "POST" or (route is not None and not route.json_body):
            await self.app(scope, receive, send)
            return
        ctype = next((v for k, v in scope["headers"] if k == b"content-type"), None)
        if not json_media(ctype):
            shown = ctype.decode("latin-1")[:100] if ctype is not None else ""
            await send_error(send, 415, f"request body must be application/json, not {shown!r}")
            return
        too_big = f"request body over the router's limit of {self.max_bytes} bytes (--max-body-bytes)"
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await send_error(send, 413, too_big)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        deadline = asyncio.get_running_loop().time() + self.read_timeout
        while more:
            try:
                async with asyncio.timeout_at(deadline):  # a context, not wait_for's extra task per chunk
                    message = await receive()
            except TimeoutError:
                await send_error(send, 408, f"request body not received within {self.read_timeout:g}s "
                                 "(--body-timeout)", [(b"connection", b"close")])
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await send_error(send, 413, too_big)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        try:
            body: Any = jsonx.loads(b"".join(chunks))
        except (jsonx.DecodeError, UnicodeDecodeError, ValueError) as exc:
            await send_error(send, 400, f"request body is not valid JSON: {exc}")
            return
        if not isinstance(body, dict):
            await send_error(send, 400, "request body must be a JSON object")
            return
        if too_deep(body):
            await send_error(send, 400, f"request body nests deeper than {MAX_DEPTH} levels")
            return
        ctx: RequestContext = scope[SCOPE_KEY]
        if body.pop("kv_transfer_params", None) is not None:
            log.warning("[%s] removed client-supplied kv_transfer_params", ctx.rid)
        ctx.cid = body.pop("conversation_id", None)
        ctx.body = body
        await self.app(scope, receive, send)


class Http10:
    """Buffer the response of an HTTP/1.0 request and send it with content-length (uvicorn would chunk it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("http_version") != "1.0":
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        parts: list[bytes] = []

        async def buffered(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            parts.append(message.get("body", b""))
            if not message.get("more_body", False) and start is not None:
                body = b"".join(parts)
                headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() not in
                           (b"content-length", b"transfer-encoding")]
                await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, buffered)
