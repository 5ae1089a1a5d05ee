"""Errors in Anthropic's shape on /v1/messages: `{"type": "error", "error": {"type": ..., "message": ...}}`.

Everything the router answers with an error there (its own 401/413/400s, refusals, a relayed engine 4xx, a 502)
is first written in OpenAI's shape by the shared code; this middleware rewrites the body on the routes marked
`anthropic` (routes.py) only.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pdctl.router.api.translated import error_parts
from pdctl.router.errors import anthropic_error
from pdctl.router.turn.context import SCOPE_KEY


class AnthropicErrors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = scope[SCOPE_KEY].route if scope["type"] == "http" else None
        if route is None or not route.anthropic:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def reshape(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = anthropic_error(start["status"], error_parts(b"".join(chunks))[0])
            headers = [(k, v) for k, v in start.get("headers", ()) if k not in (b"content-length", b"content-type")]
            await send({"type": "http.response.start", "status": start["status"], "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshape)
