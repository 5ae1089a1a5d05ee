"""The router's one error body (OpenAI's shape; Anthropic's on /v1/messages) and the helpers that send JSON from raw
ASGI code."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from starlette.types import Send

from pdctl.router import jsonx

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "request_too_large",
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


_INPUT = re.compile(r"'input': .*?(?=, 'ctx': |\}\s*$|\}\n)", re.S)
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"]+", re.I)
_HOSTPORT = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\[[0-9a-f:]+\](?::\d+)?|\blocalhost:\d+\b", re.I)
_INTERNAL = ("kv_transfer_params", "remote_engine_id", "remote_block_ids", "remote_request_id", "remote_host")


def relayed_error(status: int, content: bytes, role: str) -> bytes:
    """An engine's error answer as the client may see it: OpenAI's shape, the engine's message without the request
    echo (which carries the router-built `kv_transfer_params`), URLs or addresses of the engine plane."""
    from pdctl.router import jsonx
    message, kind = "", None
    try:
        obj: Any = jsonx.loads(content)
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict):
            message, kind = str(err.get("message") or ""), err.get("type")
        elif isinstance(obj, dict) and isinstance(obj.get("detail") or obj.get("message"), str):
            message = str(obj.get("detail") or obj.get("message"))
    except (jsonx.DecodeError, UnicodeDecodeError, ValueError):
        message = ""
    message = _HOSTPORT.sub("<engine>", _URL.sub("<engine>", _INPUT.sub("'input': <omitted>", message)))
    if not message.strip() or any(word in message for word in _INTERNAL):
        message = f"the {role} instance refused the request (HTTP {status})"
    return error_body(status, message[:2000], kind if isinstance(kind, str) and kind else None)


_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
          503: "overloaded_error", 529: "overloaded_error"}


def anthropic_error(status: int, message: str) -> bytes:
    kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return jsonx.dumps({"type": "error", "error": {"type": kind, "message": message}})
