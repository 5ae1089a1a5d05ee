"""The router's entry steps, run in order by one ASGI callable (app.Router); per-request state lives on the request's
RequestContext (context.py).

request id   every request gets its context: an id, echoed as `X-Request-Id`, and its route (routes.py), and is
             counted by route and status (`with_request_id`, app.Router)
API key      `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on every route that asks for it, when a
             key is configured (`ApiKey`)
JSON body    POST bodies: JSON content type (415), read within a deadline (408), size limit (413), a JSON
             object no deeper than MAX_DEPTH (400), client `kv_transfer_params` removed, `conversation_id`
             taken out; the parsed body is left on the context (`JsonBody`)
HTTP/1.0     HTTP/1.0 clients cannot read chunked replies: their response is sent whole, with content-length
             (`whole_reply`)

They were one ASGI middleware each; a step that has nothing to do for a request now costs it a test, not a
coroutine frame and a `send` wrapper per message (the router's CPU per request, docs/results/router-cpu).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any

from starlette.types import Message, Receive, Send

from pdctl.router import jsonx
from pdctl.router.errors import send_error
from pdctl.router.turn.context import RequestContext

log = logging.getLogger("pdctl.router")


def with_request_id(ctx: RequestContext, send: Send) -> Send:
    """`send` that adds the request's `X-Request-Id` to the response head and notes its status on the context."""
    header = (b"x-request-id", ctx.rid.encode())

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            ctx.status = message["status"]
            message["headers"] = [*message.get("headers", ()), header]
        await send(message)

    return send_with_id


class ApiKey:
    def __init__(self, key: str | None) -> None:
        self.expected = f"Bearer {key}".encode() if key else None

    def refused(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether a request with `headers` lacks the key (call only where a key is configured and asked)."""
        assert self.expected is not None
        given = next((v for k, v in headers if k == b"authorization"), b"")
        if not given:
            given = b"Bearer " + next((v for k, v in headers if k == b"x-api-key"), b"")
        return not hmac.compare_digest(given, self.expected)

    @staticmethod
    async def refuse(send: Send) -> None:
        await send_error(send, 401, "missing or invalid API key: send `Authorization: Bearer <key>` "
                         "(or `x-api-key: <key>`)", headers=[(b"www-authenticate", b"Bearer")])


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
    def __init__(self, max_bytes: int, read_timeout: float = 60.0) -> None:
        self.max_bytes = max_bytes
        self.read_timeout = read_timeout

    async def read(self, ctx: RequestContext, receive: Receive, send: Send) -> bool:
        """Read and check a POST's body onto `ctx`; False: the request was answered (an error) or its client left."""
        headers = ctx.headers
        ctype = next((v for k, v in headers if k == b"content-type"), None)
        if not json_media(ctype):
            shown = ctype.decode("latin-1")[:100] if ctype is not None else ""
            await send_error(send, 415, f"request body must be application/json, not {shown!r}")
            return False
        length = next((v for k, v in headers if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await send_error(send, 413, self.too_big())
            return False
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
                return False
            if message["type"] == "http.disconnect":
                return False
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await send_error(send, 413, self.too_big())
                return False
            chunks.append(chunk)
            more = message.get("more_body", False)
        try:
            body: Any = jsonx.loads(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        except (jsonx.DecodeError, UnicodeDecodeError, ValueError) as exc:
            await send_error(send, 400, f"request body is not valid JSON: {exc}")
            return False
        if not isinstance(body, dict):
            await send_error(send, 400, "request body must be a JSON object")
            return False
        if too_deep(body):
            await send_error(send, 400, f"request body nests deeper than {MAX_DEPTH} levels")
            return False
        if body.pop("kv_transfer_params", None) is not None:
            log.warning("[%s] removed client-supplied kv_transfer_params", ctx.rid)
        ctx.cid = body.pop("conversation_id", None)
        ctx.body = body
        return True

    def too_big(self) -> str:
        return f"request body over the router's limit of {self.max_bytes} bytes (--max-body-bytes)"


def whole_reply(send: Send) -> Send:
    """`send` for an HTTP/1.0 request: the response buffered and sent with content-length (uvicorn would chunk it)."""
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

    return buffered
