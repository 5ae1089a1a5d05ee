"""The router's one error body (OpenAI's shape) and the helpers that send JSON from raw ASGI code."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import Send

from pdctl.router import jsonx

Headers = list[tuple[bytes, bytes]]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    502: "upstream_error",
    503: "service_unavailable",
}


def error_body(status: int, message: str, kind: str | None = None) -> bytes:
    return jsonx.dumps({"error": {"message": message, "type": kind or _TYPES.get(status, "error"), "code": status}})


async def send_bytes(
    send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = (),
    content_type: bytes = b"application/json",
) -> None:
    raw = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def send_error(
    send: Send, status: int, message: str, headers: Iterable[tuple[bytes, bytes]] = (), kind: str | None = None
) -> None:
    await send_bytes(send, status, error_body(status, message, kind), headers)
