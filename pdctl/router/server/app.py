"""The router as one ASGI callable: its entry steps run in order in one frame, then a small dispatcher; the
lifespan owns the shared `httpx.AsyncClient` and the timers.

    HTTP/1.0 -> request id -> Anthropic errors -> API key -> JSON body -> conversation headers -> Dispatcher

The request id step gives each request its RequestContext (context.py) and its route (routes.py: chat and
completions, /v1/responses, /v1/messages, stateless engine routes, the router's own /health /stats /metrics
/v1/models); the steps after it and the dispatcher read both. The steps are middleware.py's, anthropic_errors.py's
and conversation_headers.py's; they were one ASGI middleware each, a coroutine frame per request and a `send`
wrapper per message, where most requests need two of them to do anything (the router's CPU per request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from pdctl.fasthttp import FastTransport
from pdctl.router.config import RouterConfig
from pdctl.router.errors import send_error
from pdctl.router.server import retention, timers
from pdctl.router.server.anthropic_errors import anthropic_shaped
from pdctl.router.server.conversation_headers import ConversationHeaders
from pdctl.router.server.membership import Membership
from pdctl.router.server.middleware import ApiKey, JsonBody, whole_reply, with_request_id
from pdctl.router.server.otlp import OtlpExporter
from pdctl.router.server.routes import ROUTES, Route, RouteTable
from pdctl.router.turn.context import NO_BODY, SCOPE_KEY, RequestContext
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream.client import LeanClient
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
        await self.dispatch(scope[SCOPE_KEY], receive, send)

    async def dispatch(self, ctx: RequestContext, receive: Receive, send: Send) -> None:
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


class Router:
    """The ASGI app: each HTTP request's entry steps (the module's docstring), then the dispatcher."""

    def __init__(self, dispatcher: Dispatcher, config: RouterConfig, routes: RouteTable) -> None:
        self.dispatcher = dispatcher
        self.state = dispatcher.state
        self.metrics = dispatcher.state.metrics
        self.routes = routes
        self.api_key = ApiKey(config.api_key)
        self.json_body = JsonBody(config.max_body_bytes, config.body_timeout)
        self.conversation_headers = ConversationHeaders(config.conversation_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.dispatcher(scope, receive, send)
            return
        t0 = time.perf_counter()
        path = scope["path"]
        route = self.routes.match(path)
        method = scope["method"]
        ctx = RequestContext(os.urandom(16).hex(), t0, method, path, scope["headers"],
                             scope.get("query_string", b""), route, NO_BODY)
        scope[SCOPE_KEY] = ctx
        if scope.get("http_version") == "1.0":
            send = whole_reply(send)
        send = with_request_id(ctx, send)
        if route is not None and route.anthropic:
            send = anthropic_shaped(send)
        try:
            if self.api_key.expected is not None and (route is None or route.auth) and \
                    self.api_key.refused(ctx.headers):
                await self.api_key.refuse(send)
                return
            if method == "POST":
                if (route is None or route.json_body) and not await self.json_body.read(ctx, receive, send):
                    return
                self.conversation_headers.resolve(ctx)
            await self.dispatcher.dispatch(ctx, receive, send)
        finally:
            self.metrics.request(self.routes.label(route), ctx.status)


def create_app(config: RouterConfig, transport: httpx.AsyncBaseTransport | None = None) -> ASGIApp:
    """The router's ASGI app; its state is reachable as `app.state` (a RouterState) for tests and tools."""
    return Router(Dispatcher(RouterState.create(config), transport), config, ROUTES)
