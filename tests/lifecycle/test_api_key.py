"""`router.api_key_env`: the smoke test sends the key the router gets, and a key the router would not get stops
`up` before anything starts."""

from __future__ import annotations

import pytest
from rich.console import Console

from pdctl.errors import LaunchError
from pdctl.lifecycle import UpOptions, up
from pdctl.lifecycle.bringup.preflight import preflight
from pdctl.plan import plan
from pdctl.remote.local import LocalTransport
from tests.conftest import free_port
from tests.lifecycle.conftest import MakeTopo

KEY = "PDCTL_TEST_ROUTER_KEY"


def test_key_only_in_env_router_passes_the_smoke_test(
    make_topo: MakeTopo, console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY, raising=False)
    topo = make_topo(router_extra=f", api_key_env: {KEY}", extra_yaml=f"env: {{router: {{{KEY}: k-123}}}}\n")
    dep = up(topo, console, UpOptions(provision=False))  # was: turn 1 answered HTTP 401
    assert dep.smoke is not None and dep.smoke.turn2.outcome == "hit"


def test_no_key_anywhere_is_refused_before_starting(
    make_topo: MakeTopo, console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY, raising=False)
    topo = make_topo(router_extra=f", api_key_env: {KEY}")
    with pytest.raises(LaunchError) as info:
        up(topo, console, UpOptions(provision=False))
    assert info.value.message == (
        f"router.api_key_env is {KEY} but the router would get no key: neither env.router nor env.all sets {KEY}, "
        "and it is not set where pdctl runs"
    )
    assert info.value.hint == f"export {KEY}=<key> before `pdctl up`, or set env.router.{KEY}"
    assert LocalTransport().find_by_marker(topo.name) == []


def test_a_key_in_pdctls_environment_does_not_reach_an_ssh_router(
    make_topo: MakeTopo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY, "k-123")
    nodes = [{"name": "local", "address": "127.0.0.1", "transport": "local"},
             {"name": "far", "address": "127.0.0.1", "port": free_port(), "transport": "ssh"}]  # never dialled
    topo = make_topo(nodes=nodes, placement=("local", "local", "far"), router_extra=f", api_key_env: {KEY}",
                     python_venv="~/.pdctl/venv")
    with pytest.raises(LaunchError) as info:
        preflight(topo, plan(topo), {})  # refused before any host is probed
    assert info.value.message == (
        f"router.api_key_env is {KEY} but the router would get no key: env.router and env.all do not set {KEY}, "
        "and the router on `far` (ssh) does not get pdctl's own environment"
    )
