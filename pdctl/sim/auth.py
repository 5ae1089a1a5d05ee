"""The engine's API key, checked as vLLM's AuthenticationMiddleware does."""

from __future__ import annotations

import hashlib
import secrets

from starlette.types import Scope

# vLLM's AuthenticationMiddleware (entrypoints/serve/utils/server_utils.py): only these prefixes are guarded
# (/health, /metrics, /tokenize stay open), OPTIONS passes, Bearer token or Anthropic's x-api-key.
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def authorized(scope: Scope, key: str) -> bool:
    path = str(scope.get("path", "")).removeprefix(str(scope.get("root_path", "")))
    if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
        return True
    if not path.startswith(GUARDED_PREFIX):
        return True
    want = hashlib.sha256(key.encode()).digest()
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    scheme, _, token = headers.get("authorization", "").partition(" ")
    given = [token] if scheme.lower() == "bearer" else []
    given += [headers["x-api-key"]] if headers.get("x-api-key") else []
    return any(secrets.compare_digest(hashlib.sha256(g.encode()).digest(), want) for g in given)
