"""JSON in and out as bytes; orjson when installed (several times faster on the hot path), else json."""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson

    def loads(data: bytes | str) -> Any:
        return orjson.loads(data)

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    DecodeError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - exercised only where orjson is absent

    def loads(data: bytes | str) -> Any:
        return json.loads(data)

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    DecodeError = json.JSONDecodeError
