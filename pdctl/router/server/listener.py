"""The router's client-facing HTTP/1.1 protocol: uvicorn's httptools protocol with the limits it lacks.

uvicorn closes idle keep-alive connections but has no deadline for a request's head, no bound on header count
or size, and no cap on connections that answers politely. A slowloris (connections that never finish their
headers) would hold file descriptors until the router fails for everyone. Here:
    a request head must arrive within `header_timeout`         -> 408 and close
    at most `max_headers` headers and `max_header_bytes` bytes  -> 431 and close
    at most `max_connections` open client connections           -> 503 + Retry-After at once, and close
Body read deadlines are the JSON body step's (middleware.JsonBody); idle keep-alive is uvicorn's
`timeout_keep_alive`. A response's writes in one event-loop step reach the socket as one write (corked.py).

A refusal is a lingering close: the answer, then a half-close, then whatever the client still sends is read and
dropped until it closes or `_LINGER` seconds pass. Closing at once with unread bytes in the socket makes the kernel
send a reset, which can destroy the answer before the client reads it.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pdctl.router.errors import error_body
from pdctl.router.server.corked import cork

_LINGER = 5.0
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


@dataclass(frozen=True)
class Limits:
    header_timeout: float
    max_headers: int
    max_header_bytes: int
    max_connections: int


def raise_nofile() -> int:
    """Lift this process's open-file soft limit to its hard limit (setsid starts inherit a shell's 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(configured: int, nofile: int) -> int:
    """Client connections allowed: as configured, else half the fd limit (the rest: upstreams, logs, slack)."""
    return configured if configured > 0 else max(64, nofile // 2)


def protocol_class(limits: Limits) -> type[HttpToolsProtocol]:
    class GuardedProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_timer: asyncio.TimerHandle | None = None
            self._head_bytes = 0
            self._head_count = 0
            self._refusal: int | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self._refuse(503, f"the router has {limits.max_connections} client connections open "
                             "(--max-client-connections); retry after 1s")
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refusal is None:
                super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = self._head_count = 0
            if self._head_timer is None:
                self._arm()

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            self._count(len(url), 0)

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            self._count(len(name) + len(value) + 4, 1)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()
            if self.cycle is not None:
                cork(self.cycle, self.loop)  # a step's writes as one (corked.py)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._disarm()  # an idle keep-alive connection is uvicorn's timeout_keep_alive's to close

        def send_400_response(self, msg: str) -> None:
            # A callback below stopped the parser by raising: answer with its status, not a plain 400.
            if self._refusal is not None:
                return
            super().send_400_response(msg)

        def _count(self, nbytes: int, headers: int) -> None:
            self._head_bytes += nbytes
            self._head_count += headers
            if self._head_count > limits.max_headers:
                self._refuse(431, f"more than {limits.max_headers} request headers")
            elif self._head_bytes > limits.max_header_bytes:
                self._refuse(431, f"request head over {limits.max_header_bytes} bytes")
            else:
                return
            raise _Refused  # stops httptools mid-parse; uvicorn's handler then calls send_400_response

        def _arm(self) -> None:
            self._head_timer = self.loop.call_later(limits.header_timeout, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self.cycle is None or self.cycle.response_complete:
                self._refuse(408, f"request head not received within {limits.header_timeout:g}s "
                             "(--header-timeout)")

        def _refuse(self, status: int, message: str) -> None:
            self._refusal = status
            self._disarm()
            if self.transport.is_closing():
                return
            body = error_body(status, message)
            extra = b"retry-after: 1\r\n" if status == 503 else b""
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n%s\r\n%s" % (status, _REASONS[status], len(body), extra, body))
            if self.transport.can_write_eof():
                self.transport.write_eof()  # the answer, then FIN; data_received drops what still comes in
                self.loop.call_later(_LINGER, self.transport.close)
            else:
                self.transport.close()

    return GuardedProtocol


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request the router refuses."""
