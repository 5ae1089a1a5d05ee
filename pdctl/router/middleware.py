"""Small stateless ASGI middlewares; per-request state lives inside `__call__`.

RequestId   gives every request an id, echoed as `X-Request-Id` and counted by route and status
ApiKey      `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on everything but /health, when a key
            is configured
JsonBody    POST bodies: size limit (413), JSON object (400), client `kv_transfer_params` removed,
            `conversation_id` taken out; the parsed body is left in scope["pdctl.body"]
"""

from __future__ import annotations

import hmac
import logging
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pdctl.router import jsonx
from pdctl.router.errors import send_error
from pdctl.router.metrics import RouterMetrics

log = logging.getLogger("pdctl.router")

ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/stats",
                    "/v1/responses", "/v1/messages", "/tokenize", "/detokenize", "/version", "/v1/embeddings",
                    "/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"})


class RequestId:
    def __init__(self, app: ASGIApp, metrics: RouterMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        scope["pdctl.rid"] = rid
        header = (b"x-request-id", rid.encode())
        status = [500]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            path = scope["path"]
            self.metrics.request(path if path in ROUTES else "other", status[0])


class ApiKey:
    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] != "http" or scope["path"] == "/health":
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


class JsonBody:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        too_big = f"request body over the router's limit of {self.max_bytes} bytes (--max-body-bytes)"
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await send_error(send, 413, too_big)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
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
        if body.pop("kv_transfer_params", None) is not None:
            log.warning("[%s] removed client-supplied kv_transfer_params", scope.get("pdctl.rid", "-"))
        scope["pdctl.cid"] = body.pop("conversation_id", None)
        scope["pdctl.body"] = body
        await self.app(scope, receive, send)
