"""`pdctl top` with more than one router: an engine is in the pool when every router that reports it holds it
healthy (each router's gauge judged on its own, not their sum); and what its KV-choice table counts."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.lifecycle import UpOptions, down, up
from pdctl.lifecycle.watch.samples import parse
from pdctl.lifecycle.watch.top import view
from pdctl.lifecycle.watch.top_render import render_top
from pdctl.plan import plan
from pdctl.router.turn.choices import Choices
from pdctl.router.turn.cost import Choice
from pdctl.router.turn.rates import Rates
from pdctl.topology import load
from tests.lifecycle.test_router_replicas import replicas_yaml

GAUGE = "# TYPE pdctl_router_upstream_healthy gauge\n"


def _router(prefill0: int, decode0: int) -> str:
    return (GAUGE + f'pdctl_router_upstream_healthy{{role="prefill",index="0"}} {prefill0}\n'
            f'pdctl_router_upstream_healthy{{role="decode",index="0"}} {decode0}\n')


def test_each_router_judges_its_own_pool(tmp_path: Path) -> None:
    path = tmp_path / "topo.yaml"
    path.write_text(replicas_yaml("h41-top-unit", tmp_path / "work", replicas=2))
    topo = load(path)
    specs = plan(topo)
    info = "# TYPE pdctl_router_upstream_info gauge\n" + "".join(
        f'pdctl_router_upstream_info{{role="{s.role}",index="{s.name.rsplit("-", 1)[1]}",url="{s.url}"}} 1\n'
        for s in specs if s.role in ("prefill", "decode"))
    routers = [s.name for s in specs if s.role == "router"]
    assert len(routers) == 2
    now = {routers[0]: parse(info + _router(1, 1)), routers[1]: parse(info + _router(1, 0))}
    pool = {i.process: i.router_healthy for i in view(topo, specs, now, {}, 1.0).instances}
    assert pool["prefill-0"] is True  # healthy in both routers: in (the sum, 2.0, read as out before)
    assert pool["decode-0"] is False  # out of one router's pool: out
    assert pool["prefill-1"] is False  # no router reports it healthy


@pytest.mark.slow
def test_top_json_with_two_routers_says_every_healthy_engine_is_in(
    tmp_path: Path, pdctl_home: Path, console: Console
) -> None:
    path = tmp_path / "topo.yaml"
    path.write_text(replicas_yaml(f"h41-top-{uuid.uuid4().hex[:6]}", tmp_path / "work", replicas=2))
    topo = load(path)
    try:
        up(topo, console, UpOptions(smoke=False))
        result = CliRunner().invoke(app, ["top", "-t", str(path), "--once", "--interval", "0.5", "--json"])
        assert result.exit_code == 0, result.stderr
        instances = json.loads(result.stdout)["instances"]
        engines = {i["process"]: i for i in instances if i["component"] in ("prefill", "decode")}
        assert sorted(engines) == ["decode-0", "decode-1", "prefill-0", "prefill-1"]
        assert all(i["up"] and i["router_healthy"] is True for i in engines.values()), engines
        assert len([i for i in instances if i["component"] == "router"]) == 2
    finally:
        down(topo, console)


def test_top_counts_the_probes_of_a_decode_beside_the_models_choices(tmp_path: Path) -> None:
    # The router's own choice metrics (a probe, then a model choice), read by `top` from its /metrics text.
    path = tmp_path / "topo.yaml"
    path.write_text(replicas_yaml("h41-top-probe", tmp_path / "work", replicas=1))
    topo = load(path)
    specs = plan(topo)
    router = next(s.name for s in specs if s.role == "router")
    registry = CollectorRegistry()
    made = Choices(registry, Rates(lambda: 1.0), 200.0, 0.0)
    before = parse(generate_latest(registry).decode())
    made.made(Choice("decode_cache", 150.0, 0.0, "probe", 256), 0.12)
    made.made(Choice("decode_cache", 90.0, 0.0, "model", 256), 0.09)
    v = view(topo, specs, {router: parse(generate_latest(registry).decode())}, {router: before}, 1.0)
    assert (v.kv_choice_probe, v.kv_choice_default, v.kv_choice["decode_cache"]) == (1.0, 0.0, 2.0)
    console = Console(record=True, width=200)
    render_top(v, console)
    assert "probes of the decode 1" in console.export_text()
