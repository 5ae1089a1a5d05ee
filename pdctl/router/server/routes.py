"""The router's routes, declared once: the dispatcher (app.Dispatcher) runs their handlers, the entry steps read
what they need of them (the metrics label, whether the API key is asked, which error shape is spoken).

A path with no route is a 404 (after the API key); a route called with another method is a 405 when it takes
POST and a 404 when it takes GET.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from starlette.types import Receive, Send

from pdctl.router.api import chat, messages, responses
from pdctl.router.server import endpoints, passthrough, reset
from pdctl.router.turn.context import RequestContext, RouteInfo
from pdctl.router.turn.state import RouterState

Handler = Callable[[RouterState, RequestContext, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    method: Literal["GET", "POST"]
    handler: Handler
    prefix: bool = False  # `path` starts the paths it serves (/v1/models/{model}); counted as "other"
    auth: bool = True  # False: answers without the API key (/health: load balancers probe it)
    anthropic: bool = False  # errors in Anthropic's shape (anthropic_errors.py)
    json_body: bool = True  # False: the body is not read (an admin action; clients POST it empty, of any type)


class RouteTable:
    def __init__(self, routes: Iterable[Route]) -> None:
        self.routes = tuple(routes)
        self._exact = {r.path: r for r in self.routes if not r.prefix}
        self._prefixed = tuple(r for r in self.routes if r.prefix)

    def match(self, path: str) -> Route | None:
        route = self._exact.get(path)
        if route is None:
            for r in self._prefixed:
                if path.startswith(r.path):
                    return r
        return route

    @staticmethod
    def label(route: RouteInfo | None) -> str:
        """The route's name in the request metrics: its path, or "other" (no route, or a prefix's many paths)."""
        return route.path if route is not None and not route.prefix else "other"


# Stateless engine routes: forwarded as they are (passthrough.py).
_ENGINE_POST = ("/tokenize", "/detokenize", "/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score",
                "/rerank", "/v1/rerank", "/v2/rerank")

ROUTES = RouteTable([
    Route("/v1/chat/completions", "POST", chat.generation),
    Route("/v1/completions", "POST", chat.generation),
    Route("/v1/responses", "POST", responses.create),
    Route("/v1/messages", "POST", messages.create, anthropic=True),
    *(Route(path, "POST", passthrough.forward) for path in _ENGINE_POST),
    Route("/version", "GET", passthrough.forward),
    Route(passthrough.MODEL_PREFIX, "GET", passthrough.model, prefix=True),
    Route("/v1/models", "GET", endpoints.models),
    Route("/health", "GET", endpoints.health, auth=False),
    Route("/stats", "GET", endpoints.stats),
    Route("/metrics", "GET", endpoints.metrics),
    Route("/reset_prefix_cache", "POST", reset.reset_prefix_cache, json_body=False),
])
