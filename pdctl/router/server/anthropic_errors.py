"""Errors in Anthropic's shape on /v1/messages: `{"type": "error", "error": {"type": ..., "message": ...}}`.

Everything the router answers with an error there (its own 401/413/400s, refusals, a relayed engine 4xx, a 502)
is first written in OpenAI's shape by the shared code; on the routes marked `anthropic` (routes.py) only, the
router (app.Router) sends through `anthropic_shaped`, which rewrites the body.
"""

from __future__ import annotations

from starlette.types import Message, Send

from pdctl.router.api.translated import error_parts
from pdctl.router.errors import anthropic_error


def anthropic_shaped(send: Send) -> Send:
    """`send` that rewrites an error response (status >= 400) in Anthropic's shape; other responses pass as sent."""
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

    return reshape
