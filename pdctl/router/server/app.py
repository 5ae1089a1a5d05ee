"""The router as one ASGI callable: middlewares built explicitly around a small dispatcher; the lifespan owns
the shared `httpx.AsyncClient` and the timers.

    Http10 -> RequestId -> AnthropicErrors -> ApiKey -> JsonBody -> ConversationHeaders -> Dispatcher

RequestId gives each request its RequestContext (context.py) and its route (routes.py: chat and completions,
/v1/responses, /v1/messages, stateless engine routes, the router's own /health /stats /metrics /v1/models); the
middlewares inside it and the dispatcher read both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from pdctl.router.config import RouterConfig
from pdctl.router.errors import send_error
from pdctl.router.server import retention, timers
from pdctl.router.server.anthropic_errors import AnthropicErrors
from pdctl.router.server.conversation_headers import ConversationHeaders
from pdctl.router.server.membership import Membership
from pdctl.router.server.middleware import ApiKey, Http10, JsonBody, RequestId
from pdctl.router.server.otlp import OtlpExporter
from pdctl.router.server.routes import ROUTES, Route
from pdctl.router.turn.context import SCOPE_KEY, RequestContext
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream.client import LeanClient
from pdctl.router.upstream.transport import FastTransport
from pdctl.secret import bearer

log = logging.getLogger("pdctl.router")


class Dispatcher:
    def __init__(self, state: RouterState, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.state = state
        self.transport = transport
        self._tasks: list[asyncio.Task[None]] = []
        self.membership = Membership(state)
        self.exporter: OtlpExporter | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        ctx: RequestContext = scope[SCOPE_KEY]
        route = ctx.route
        if isinstance(route, Route) and ctx.method == route.method:
            await route.handler(self.state, ctx, receive, send)
        elif route is not None and route.method == "POST":
            await send_error(send, 405, f"{ctx.path} takes POST")
        else:
            await send_error(send, 404, f"no route {ctx.method} {ctx.path}")

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
        self.state.client = LeanClient(
            headers=bearer(cfg.engine_key),
            transport=self.transport or FastTransport(max_idle=cfg.max_connections),
            timeout=httpx.Timeout(cfg.request_timeout, connect=cfg.connect_timeout),
        )
        self.state.releaser.client = self.state.client
        self._tasks = [asyncio.create_task(timers.health_loop(self.state)),
                       asyncio.create_task(timers.sweep_loop(self.state))]
        if self.state.capacities.needed:
            self._tasks.append(asyncio.create_task(self.state.capacities.loop(
                self.state.decode, self.state.client, cfg.health_interval, cfg.health_timeout)))
        if cfg.mode == "disaggregated" and cfg.overflow_kv:
            self._tasks.append(asyncio.create_task(self.state.kv_use.loop(
                (self.state.prefill, self.state.decode), self.state.client, cfg.health_timeout)))
        self.membership.start()  # the members file, the decodes' tripwires, SIGHUP
        if cfg.mode == "disaggregated":  # after the members file: earlier routers' pins are on its decodes
            self._tasks += retention.start(self.state)
        if self.state.tracer is not None and cfg.otlp_endpoint:
            self.exporter = OtlpExporter(self.state.tracer, cfg.otlp_endpoint, cfg.otlp_service_name)
            self._tasks.append(asyncio.create_task(self.exporter.run()))
            log.info("Tracing: OTLP/HTTP to %s (service %s)", self.exporter.url, cfg.otlp_service_name)
        if cfg.mode == "aggregated":
            log.info("Ready: aggregated, %d engines", len(cfg.decode))
        else:
            log.info("Ready: %d prefill, %d decode instances", len(self.state.prefill.members),
                     len(self.state.decode.members))

    async def shutdown(self) -> None:
        if self.state.config.mode == "disaggregated":
            await self.state.retention.shutdown(self.state.config.shutdown_release_timeout)
        self._tasks += self.membership.tasks()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.state.releaser.close()
        if self.state.retention.journal is not None:
            self.state.retention.journal.close()
        if self.exporter is not None:
            await self.exporter.close()
        if self.state.client is not None:
            await self.state.client.aclose()


def create_app(config: RouterConfig, transport: httpx.AsyncBaseTransport | None = None) -> ASGIApp:
    """The router's ASGI app; its state is reachable as `app.state` (a RouterState) for tests and tools."""
    state = RouterState.create(config)
    app: ASGIApp = Dispatcher(state, transport)
    app = ConversationHeaders(app, config.conversation_headers)
    app = JsonBody(app, config.max_body_bytes, config.body_timeout)
    app = ApiKey(app, config.api_key)
    app = AnthropicErrors(app)
    app = RequestId(app, state.metrics, ROUTES)
    app = Http10(app)
    app.state = state  # type: ignore[attr-defined]
    return app
