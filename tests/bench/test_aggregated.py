"""The aggregated leg: one engine from the same topology, serving whole requests, side by side with a P/D leg."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from pdctl.bench.legs import endpoints
from pdctl.cli import app
from pdctl.plan import plan
from pdctl.topology import load

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
