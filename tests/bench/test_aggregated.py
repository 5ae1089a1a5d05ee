"""The aggregated leg: one engine from the same topology, serving whole requests, side by side with a P/D leg."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from pdctl.bench.leg.legs import endpoints, parse_leg
from pdctl.cli import app
from pdctl.plan import plan
from pdctl.topology import load
from tests.conftest import free_port

pytestmark = pytest.mark.slow


def test_an_aggregated_leg_runs_beside_a_disaggregated_one(sim_topology: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["bench", "-t", str(sim_topology), "--lengths", "256", "--conversations", "1", "--turns", "2",
            "--user-tokens", "16", "--output-tokens", "4", "--api", "completions", "--out", str(out), "--json",
            "--leg", "on:connector.bidirectional_kv_xfer=true", "--leg", "agg:mode=aggregated"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    on, agg = data["legs"]
    assert (on["name"], agg["name"]) == ("on", "agg")
    assert agg["passed"] is True and agg["bidirectional"] is False, agg
    assert agg["kv_transfer"]["transfers"] == 0
    records = json.loads((out / "requests.json").read_text())
    mine = [r for r in records if r["leg"] == "agg"]
    assert len(mine) == 2 and all(r["status"] == 200 and r["output_num_tokens"] == 4 for r in mine)
    assert agg["mode"] == "aggregated" and on["mode"] == "disaggregated"
    report = (out / "report.md").read_text()
    assert "| agg | mode=aggregated | aggregated (one engine) | 2 | pass |" in report, report
    assert "| length | on | agg | on/agg |" in report
    # it was stopped before the bench: neither the engine nor the router is left running
    aggregated = load(sim_topology, ["mode=aggregated"])
    for url in (endpoints(aggregated).router_url, endpoints(load(sim_topology)).router_url):
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)


def test_the_aggregated_plan_is_one_engine_without_a_connector(sim_topology: Path) -> None:
    topo = load(sim_topology, ["mode=aggregated"])
    (engine,) = plan(topo)
    assert (engine.name, engine.role, engine.url) == ("aggregated-0", "decode", f"http://127.0.0.1:{topo.decode[0].port}")
    assert "--kv-transfer-config" not in engine.argv and "--no-enable-prefix-caching" not in engine.argv
    assert endpoints(topo).router_url == engine.url and endpoints(topo).prefill_urls == ()


def test_an_aggregated_leg_on_two_decodes_measures_two_engines_behind_the_router(sim_topology: Path,
                                                                                 tmp_path: Path) -> None:
    out = tmp_path / "out"
    ports = [(free_port(), free_port()) for _ in range(2)]
    decodes = ", ".join(f"{{node: local, port: {p}, side_channel_port: {s}}}" for p, s in ports)
    leg = f"agg2:mode=aggregated,decode=[{decodes}]"
    args = ["bench", "-t", str(sim_topology), "--lengths", "256", "--conversations", "2", "--turns", "2",
            "--user-tokens", "16", "--output-tokens", "4", "--api", "chat", "--out", str(out), "--json",
            "--leg", "agg:mode=aggregated", "--leg", leg]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    one, two = data["legs"]
    assert (one["engines"], two["engines"]) == (1, 2) and two["mode"] == "aggregated" and two["passed"], two
    assert two["router_stats"] is not None and two["router_stats"]["requests_total"] >= 4  # through the router
    records = json.loads((out / "requests.json").read_text())
    assert len([r for r in records if r["leg"] == "agg2" and r["status"] == 200]) == 4
    report = (out / "report.md").read_text()
    assert "| aggregated (one engine) | 4 | pass |" in report and "| aggregated (2 engines) | 4 | pass |" in report
    topo = load(sim_topology, list(parse_leg(leg).overrides))
    assert [s.name for s in plan(topo)] == ["aggregated-0", "aggregated-1", "router"]
    for url in (*endpoints(topo).decode_urls, endpoints(topo).router_url):  # stopped again after the bench
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)
