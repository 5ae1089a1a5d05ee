"""JSON in and out as bytes; orjson when installed (several times faster on the hot path), else json.

With orjson, `loads` and `dumps` are orjson's own functions, not wrappers: the router calls them about twenty
times per request (request body, prefill answer, every SSE event), and a wrapper's Python frame each time cost
as much as a small event's parse."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

loads: Callable[[bytes | str], Any]
dumps: Callable[[Any], bytes]

try:
    import orjson

    loads = orjson.loads
    dumps = orjson.dumps
    DecodeError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - exercised only where orjson is absent

    def _loads(data: bytes | str) -> Any:
        return json.loads(data)

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    loads, dumps = _loads, _dumps
    DecodeError = json.JSONDecodeError
