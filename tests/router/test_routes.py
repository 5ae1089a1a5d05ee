"""The route table: one declaration that the dispatcher serves and the middlewares read (metrics label, API key,
error shape)."""

from __future__ import annotations

import re

import httpx

from pdctl.router.server.routes import ROUTES, RouteTable
from tests.router.agents import assert_anthropic_error, assert_openai_error
from tests.router.conftest import AGENT_KEY, RouterProc
from tests.support.sim_procs import SERVED


def test_match_exact_then_prefix() -> None:
    listing, one = ROUTES.match("/v1/models"), ROUTES.match("/v1/models/some/model")
    assert listing is not None and not listing.prefix and listing.handler.__name__ == "models"
    assert one is not None and one.prefix and one.handler.__name__ == "model"
    assert ROUTES.match("/v1/nothing") is None
    assert [RouteTable.label(ROUTES.match(p)) for p in ("/v1/chat/completions", "/classify", "/v1/models/x",
                                                        "/v1/nothing")] == \
        ["/v1/chat/completions", "/classify", "other", "other"]


def test_paths_are_declared_once() -> None:
    paths = [r.path for r in ROUTES.routes]
    assert len(paths) == len(set(paths))
    assert [r.path for r in ROUTES.routes if not r.auth] == ["/health"]
    assert [r.path for r in ROUTES.routes if r.anthropic] == ["/v1/messages"]


def _counts(router: RouterProc) -> dict[str, float]:
    text = httpx.get(router.url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for route, status, value in re.findall(r'^pdctl_router_requests_total\{route="([^"]*)",status="(\d+)"\} (\S+)$',
                                           text, re.M):
        out[f"{route} {status}"] = out.get(f"{route} {status}", 0) + float(value)
    return out


def test_every_route_is_counted_under_its_own_name(router: RouterProc) -> None:
    before = _counts(router)
    tokenize = {"model": SERVED, "prompt": "w1"}
    httpx.post(router.url + "/classify", json=tokenize, timeout=10)  # the simulator has no classifier: 404
    httpx.post(router.url + "/tokenize", json=tokenize, timeout=10)
    httpx.get(router.url + "/version", timeout=10)
    httpx.get(f"{router.url}/v1/models/{SERVED}", timeout=10)
    httpx.get(router.url + "/v1/nothing", timeout=10)
    httpx.get(router.url + "/health", timeout=10)
    after = _counts(router)
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert delta == {"/classify 404": 1, "/tokenize 200": 1, "/version 200": 1, "other 200": 1, "other 404": 1,
                     "/health 200": 1, "/metrics 200": 1}


def test_methods_the_route_does_not_take(router: RouterProc, agent_router: RouterProc) -> None:
    # POST to a GET route: the body rules run first, then no route; GET to a POST route: 405.
    assert_openai_error(httpx.post(router.url + "/health", json={}, timeout=10), 404, "no route POST /health")
    assert_openai_error(httpx.delete(router.url + "/v1/chat/completions", timeout=10), 405,
                        "/v1/chat/completions takes POST")
    # The route's error shape and key requirement hold whatever the method.
    auth = {"x-api-key": AGENT_KEY}
    assert_anthropic_error(httpx.get(agent_router.url + "/v1/messages", headers=auth, timeout=10), 405,
                           "invalid_request_error", "/v1/messages takes POST")
    assert httpx.post(agent_router.url + "/health", json={}, timeout=10).status_code == 404
    assert httpx.get(agent_router.url + "/stats", timeout=10).status_code == 401
