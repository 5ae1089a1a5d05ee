"""A client that sends a conversation's next turn the instant it has read the end of the last (an agent loop).

A streamed turn stays open until the next turn's response has started: the client never waits for the router's
connection to close, only for the API's end event (`[DONE]`, `response.completed`, `message_stop`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx


class Instant:
    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(timeout=30)
        self._open: httpx.Response | None = None

    def post(self, path: str, body: dict[str, Any], end: bytes, headers: dict[str, str] | None = None,
             ) -> tuple[httpx.Headers, bytes]:
        """Send one turn; return its headers and raw body as far as its end event (streamed) or whole."""
        if not body.get("stream"):
            r = self.client.post(self.url + path, json=body, headers=headers)
            self._close()
            assert r.status_code == 200, r.text
            return r.headers, r.content
        req = self.client.build_request("POST", self.url + path, json=body, headers=headers)
        r = self.client.send(req, stream=True)
        self._close()  # the last turn's stream closes only now that this turn has been answered
        assert r.status_code == 200, r.read()
        raw = b""
        for chunk in r.iter_raw():
            raw += chunk
            at = raw.find(end)
            if at >= 0 and raw.find(b"\n\n", at) >= 0:
                break
        self._open = r
        return r.headers, raw

    def _close(self) -> None:
        if self._open is not None:
            self._open.close()
            self._open = None

    def close(self) -> None:
        self._close()
        self.client.close()


def sse_data(raw: bytes) -> Iterator[dict[str, Any]]:
    for line in raw.decode().split("\n"):
        if line.startswith("data: {"):
            yield json.loads(line[6:])


def reuse_header(headers: httpx.Headers) -> str:
    return headers.get("x-pd-kv-reuse", "")
