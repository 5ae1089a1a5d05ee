"""The router's upstream HTTP client: httpx.AsyncClient, with its hot calls sent straight to FastTransport.

Per upstream request httpx's client layer (URL parsing and merging, header merging, the cookie jar, auth and
redirect handling, event hooks) cost the router more CPU than the transport and the JSON work together. The
router's calls to its engines need none of it: a POST of bytes already encoded to a URL it built itself. `post`
(with no option but a timeout in seconds) and `stream_post` write the request's bytes to FastTransport directly
(the URL's address and path parsed once per URL) and return an ordinary httpx.Response; any other call, or
another transport (tests pass their own), takes httpx's own path unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, NamedTuple

import httpx

from pdctl.fasthttp import Body, FastTransport, Key

_MAX_URLS = 4096  # distinct upstream URLs remembered (engines x paths: a handful in practice)


class Whole(NamedTuple):
    """A whole (non-streamed) answer as the router reads it: its status and its decoded body."""

    status_code: int
    content: bytes


class LeanClient(httpx.AsyncClient):
    def __init__(self, *, transport: httpx.AsyncBaseTransport, headers: Mapping[str, str] | None = None,
                 timeout: httpx.Timeout) -> None:
        super().__init__(headers=headers, transport=transport, timeout=timeout)
        self._fast = transport if isinstance(transport, FastTransport) else None
        self._connect_timeout, self._read_timeout = timeout.connect, timeout.read
        self._defaults = b"".join(b"%s: %s\r\n" % (k, v) for k, v in self.headers.raw
                                  if k.lower() not in (b"host", b"content-length", b"transfer-encoding",
                                                       b"accept-encoding", b"connection"))
        self._urls: dict[str, tuple[Key, bytes]] = {}

    def _target(self, url: str) -> tuple[Key, bytes] | None:
        """The address and request head start (request line + host) of a plain-http URL; None for others."""
        got = self._urls.get(url)
        if got is None:
            u = httpx.URL(url)
            if u.scheme != "http" or not u.host:
                return None
            port = u.port or 80
            if len(self._urls) >= _MAX_URLS:
                self._urls.clear()
            got = self._urls[url] = ((u.host, port), b"POST %s HTTP/1.1\r\nhost: %s:%d\r\n%s" % (
                u.raw_path, u.host.encode("ascii"), port, self._defaults))
        return got

    async def _send_raw(self, url: str, content: bytes, headers: Mapping[str, str] | None,
                        timeout: float | None = None) -> tuple[int, list[tuple[bytes, bytes]], Body] | None:
        target = self._target(url) if self._fast is not None else None
        if target is None or self._fast is None:
            return None
        key, head = target
        extra = b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1"))
                         for k, v in (headers or {}).items()
                         if k.lower() not in ("content-length", "transfer-encoding", "host"))
        payload = b"%s%scontent-length: %d\r\n\r\n%s" % (head, extra, len(content), content)
        connect, read = (self._connect_timeout, self._read_timeout) if timeout is None else (timeout, timeout)
        return await self._fast.exchange(key, payload, connect, read)

    async def _exchange(self, url: str, content: bytes, headers: Mapping[str, str] | None,
                        timeout: float | None = None) -> httpx.Response | None:
        got = await self._send_raw(url, content, headers, timeout)
        if got is None:
            return None
        status, raw, stream = got
        return httpx.Response(status, headers=raw, stream=stream)

    async def post_whole(self, url: str, content: bytes, headers: dict[str, str] | None = None,
                         timeout: float | None = None) -> Whole:
        """A POST whose whole answer is read: its status and body. On the fast path no httpx.Response is built
        (its header normalisation alone costs more than the rest of a small answer); an answer with a
        `content-encoding` and any other transport take `post`, which decodes it."""
        got = await self._send_raw(url, content, headers, timeout)
        if got is not None:
            status, raw, stream = got
            if not any(k.lower() == b"content-encoding" for k, _ in raw):
                try:
                    return Whole(status, b"".join([chunk async for chunk in stream]))
                finally:
                    await stream.aclose()
            resp = httpx.Response(status, headers=raw, stream=stream)
            try:
                await resp.aread()
            finally:
                await resp.aclose()
            return Whole(status, resp.content)
        if timeout is None:
            resp = await super().post(url, content=content, headers=headers)
        else:
            resp = await super().post(url, content=content, headers=headers, timeout=timeout)
        return Whole(resp.status_code, resp.content)

    async def post(self, url: httpx.URL | str, *, content: Any = None, headers: Any = None,
                   **kwargs: Any) -> httpx.Response:
        timeout = kwargs.get("timeout")  # a number of seconds (the releases' own), as httpx.Timeout(timeout)
        if set(kwargs) <= {"timeout"} and isinstance(timeout, int | float | None) and isinstance(url, str) and (
                isinstance(content, bytes) and (headers is None or isinstance(headers, dict))):
            resp = await self._exchange(url, content, headers, timeout)
            if resp is not None:
                try:
                    stream = resp.stream
                    if isinstance(stream, Body) and "content-encoding" not in resp.headers:
                        # The whole body straight from the transport: aread() would pass each chunk through
                        # aiter_bytes, a content decoder and aiter_raw for an identity-encoded body.
                        resp._content = b"".join([chunk async for chunk in stream])
                    await resp.aread()  # a no-op once the content is set
                finally:
                    await resp.aclose()
                return resp
        return await super().post(url, content=content, headers=headers, **kwargs)

    async def stream_post(self, url: str, content: bytes, headers: dict[str, str]) -> httpx.Response:
        """A streamed POST: the response's head is in; its body is read with aiter_raw(), then aclose()."""
        resp = await self._exchange(url, content, headers)
        if resp is not None:
            return resp
        return await self.send(self.build_request("POST", url, content=content, headers=headers), stream=True)


def raw_chunks(resp: httpx.Response) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive: FastTransport's stream itself (no per-chunk httpx bookkeeping), else
    aiter_raw(). Close the response when done, as with aiter_raw()."""
    if isinstance(resp.stream, Body):
        return resp.stream.__aiter__()
    return resp.aiter_raw()
