"""The router as one ASGI callable: middlewares built explicitly around a small dispatcher; the lifespan owns
the shared `httpx.AsyncClient` and the timers.

    Http10 -> RequestId -> AnthropicErrors -> ApiKey -> JsonBody -> ConversationHeaders -> Endpoints

Routes: chat and completions (proxy; batches for prompt lists and n > 1), /v1/responses (responses),
/v1/messages (messages), stateless engine routes (passthrough), and the router's own /health /stats /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from pdctl.router import batches, jsonx, messages, passthrough, proxy, responses, tasks, tripwire
from pdctl.router.apishape import AnthropicErrors
from pdctl.router.config import RouterConfig
from pdctl.router.errors import send_bytes, send_error
from pdctl.router.identity import ConversationHeaders
from pdctl.router.middleware import ApiKey, Http10, JsonBody, RequestId
from pdctl.router.response_store import ResponseStore
from pdctl.router.state import RouterState
from pdctl.router.transport import FastTransport

log = logging.getLogger("pdctl.router")

_POST = {"/v1/chat/completions": True, "/v1/completions": False}
_AGENT_POST = ("/v1/responses", "/v1/messages")


class Endpoints:
    def __init__(self, state: RouterState, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.state = state
        self.transport = transport
        cfg = state.config
        self.responses = ResponseStore(cfg.handle_lifetime, cfg.max_handles)
        self._tasks: list[asyncio.Task[None]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in _POST or path in _AGENT_POST or path in passthrough.POST_ROUTES:
            if method != "POST":
                await send_error(send, 405, f"{path} takes POST")
            else:
                await self.post(scope, receive, send)
        elif method == "GET" and (path in passthrough.GET_ROUTES or path.startswith(passthrough.MODEL_PREFIX)):
            if path in passthrough.GET_ROUTES:
                await passthrough.forward(self.state, scope, send)
            else:
                await passthrough.model(self.state, scope, send)
        elif method != "GET" or path not in ("/health", "/stats", "/metrics", "/v1/models"):
            await send_error(send, 404, f"no route {method} {path}")
        elif path == "/health":
            await self.health(send)
        elif path == "/stats":
            await send_bytes(send, 200, jsonx.dumps(self.state.stats()))
        elif path == "/metrics":
            st = self.state
            body = st.metrics.exposition(len(st.handles), st.prefill, st.decode)
            await send_bytes(send, 200, body, content_type=b"text/plain; version=0.0.4; charset=utf-8")
        else:
            await self.models(send)

    async def post(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, st, body = scope["path"], self.state, scope["pdctl.body"]
        if path == "/v1/responses":
            await responses.create(st, self.responses, scope, receive, send)
        elif path == "/v1/messages":
            await messages.create(st, scope, receive, send)
        elif path in passthrough.POST_ROUTES:
            await passthrough.forward(st, scope, send)
        elif not _POST[path] and (batch := batches.prompts(body)) is not None:
            await batches.completions(st, scope, receive, send, batch)
        elif batches.samples(body) > 1:
            await batches.sampled(st, scope, receive, send, chat=_POST[path])
        else:
            await proxy.completion(st, scope, receive, send, chat=_POST[path])

    async def health(self, send: Send) -> None:
        st = self.state
        pools = {p.role: {"healthy": len(p.healthy()), "total": len(p.members)} for p in (st.prefill, st.decode)}
        down = [role for role, n in pools.items() if not n["healthy"]]
        if down:
            reason = " and ".join(f"no healthy {r} instance" for r in down)
            await send_bytes(send, 503, jsonx.dumps({"status": "unavailable", "reason": reason, **pools}))
        else:
            await send_bytes(send, 200, jsonx.dumps({"status": "ok", "live_handles": len(st.handles), **pools}))

    async def models(self, send: Send) -> None:
        for u in self.state.decode.healthy():
            try:
                resp = await self.state.http.get(f"{u.url}/v1/models")
            except httpx.HTTPError:
                continue
            if resp.status_code == 200:
                await send_bytes(send, 200, resp.content)
                return
        await send_error(send, 503, "no decode instance answered /v1/models")

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        cfg = self.state.config
        self.state.client = httpx.AsyncClient(
            headers={"authorization": f"Bearer {cfg.engine_key}"} if cfg.engine_key else None,
            transport=self.transport or FastTransport(max_idle=cfg.max_connections),
            timeout=httpx.Timeout(cfg.request_timeout, connect=cfg.connect_timeout),
        )
        self._tasks = [asyncio.create_task(tasks.health_loop(self.state)),
                       asyncio.create_task(tasks.sweep_loop(self.state))]
        self._tasks += [asyncio.create_task(tripwire.watch(self.state.decode, u, min(cfg.health_interval, 0.5)))
                        for u in self.state.decode.members]
        log.info("Ready: %d prefill, %d decode instances", len(cfg.prefill), len(cfg.decode))

    async def shutdown(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self.state.client is not None:
            await self.state.client.aclose()


def create_app(config: RouterConfig, transport: httpx.AsyncBaseTransport | None = None) -> ASGIApp:
    """The router's ASGI app; its state is reachable as `app.state` (a RouterState) for tests and tools."""
    state = RouterState.create(config)
    app: ASGIApp = Endpoints(state, transport)
    app = ConversationHeaders(app, config.conversation_headers)
    app = JsonBody(app, config.max_body_bytes, config.body_timeout)
    app = ApiKey(app, config.api_key)
    app = AnthropicErrors(app)
    app = RequestId(app, state.metrics)
    app = Http10(app)
    app.state = state  # type: ignore[attr-defined]
    return app
