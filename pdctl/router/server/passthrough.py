"""Routes that carry no KV state (routes.py: /tokenize, /v1/embeddings, /version, ...), forwarded to one healthy
engine and answered as it answers.

The body went through the router's own rules first (API key, size limit, JSON object, kv_transfer_params
removed). The engine is the least busy healthy one, prefills before decodes (their time is not on a stream's
critical path); one that cannot be reached or answers 5xx is retried once on another. Only the engine's status,
content type and body come back, never its headers or address.

GET /v1/models/{id} is answered by the router from a decode's /v1/models (vLLM serves only the list).
"""

from __future__ import annotations

import logging
from urllib.parse import unquote

import httpx
from starlette.types import Receive, Send

from pdctl.router import jsonx
from pdctl.router.errors import send_bytes, send_error
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream.pools import Upstream

log = logging.getLogger("pdctl.router")

MODEL_PREFIX = "/v1/models/"


def _candidates(state: RouterState) -> list[Upstream]:
    ranked = [(u.outstanding, n, u) for n, u in enumerate([*state.prefill.healthy(), *state.decode.healthy()])]
    return [u for _, _, u in sorted(ranked, key=lambda t: (t[0], t[1]))]


async def forward(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    path, method, query = ctx.path, ctx.method, ctx.query
    target = path + ("?" + query.decode("latin-1") if query else "")
    content = jsonx.dumps(ctx.body) if method == "POST" else b""
    headers = {"x-request-id": ctx.rid}
    if method == "POST":
        headers["content-type"] = "application/json"
    for u in _candidates(state)[:2]:
        u.outstanding += 1
        try:
            resp = await state.http.request(method, f"{u.url}{target}", content=content, headers=headers)
        except httpx.HTTPError as exc:
            state.metrics.error(u.role, "timeout" if isinstance(exc, httpx.TimeoutException) else "connect")
            log.warning("[%s] %s: %s instance unreachable; trying another", ctx.rid, path, u.role)
            continue
        finally:
            u.outstanding -= 1
        if resp.status_code >= 500:
            state.metrics.error(u.role, f"http_{resp.status_code}")
            continue
        ctype = resp.headers.get("content-type", "application/json").encode("latin-1")
        await send_bytes(send, resp.status_code, resp.content, content_type=ctype)
        return
    await send_error(send, 502 if _candidates(state) else 503, f"no engine instance could serve {path}")


async def model(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    """One model of the decodes' /v1/models list, as OpenAI's GET /v1/models/{model} returns it."""
    wanted = unquote(ctx.path[len(MODEL_PREFIX):])
    for u in state.decode.healthy():
        try:
            resp = await state.http.get(f"{u.url}/v1/models")
            listing = jsonx.loads(resp.content) if resp.status_code == 200 else None
        except (httpx.HTTPError, jsonx.DecodeError, ValueError):
            continue
        if not isinstance(listing, dict):
            continue
        for entry in listing.get("data") or ():
            if isinstance(entry, dict) and entry.get("id") == wanted:
                await send_bytes(send, 200, jsonx.dumps(entry))
                return
        await send_error(send, 404, f"The model `{wanted}` does not exist.", kind="invalid_request_error")
        return
    await send_error(send, 503, "no decode instance answered /v1/models")
