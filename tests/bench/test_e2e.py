"""The whole bench through the CLI on a simulated deployment: legs redeployed by the lifecycle, guards, report,
and the deployment left as it was found."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from pdctl.bench.leg.legs import endpoints
from pdctl.cli import app
from pdctl.lifecycle.bringup.pipeline import UpOptions, up
from pdctl.topology import load

pytestmark = pytest.mark.slow

SHORT = ["--lengths", "128,512", "--conversations", "1", "--turns", "3", "--user-tokens", "16",
         "--output-tokens", "4", "--clients", "1"]


def _router_up(topo_path: Path) -> bool:
    try:
        return httpx.get(f"{endpoints(load(topo_path)).router_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_off_on_and_a_leg_forced_to_miss(sim_topology: Path, tmp_path: Path) -> None:
    up(load(sim_topology), Console(stderr=True, color_system=None), UpOptions(smoke=False))
    out = tmp_path / "out"
    legs = ["--leg", "off:connector.bidirectional_kv_xfer=false", "--leg", "on:connector.bidirectional_kv_xfer=true",
            "--leg", "expired:connector.bidirectional_kv_xfer=true,extra_args.decode=[--no-stream-kv-params]"]
    result = CliRunner().invoke(app, ["bench", "-t", str(sim_topology), *SHORT, *legs, "--out", str(out), "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    assert data["passed"] is False and data["simulated"] is True
    off, on, expired = data["legs"]
    assert (off["passed"], on["passed"], expired["passed"]) == (True, True, False)
    # the decode streams no handle (vLLM < 0.33 unpatched): a leg that is on but never reuses fails
    assert expired["failures"] == ["KV reuse on 0 of 4 warm turns (0%, need 90%); misses: no_handle_returned x4"]
    assert on["hit_rate"] == 1.0 and off["hit_rate"] == 0.0
    assert on["kv_transfer"]["transfers"] >= 4 and on["kv_transfer"]["bytes"] > 0
    assert on["kv_transfer"]["source"] == "metrics" and off["kv_transfer"]["transfers"] == 0
    records = json.loads((out / "requests.json").read_text())
    assert len(records) == 3 * 2 * 3
    assert {r["reuse"] for r in records if r["leg"] == "on" and r["turn"] >= 1} == {"hit"}
    assert all(r["output_num_tokens"] == 4 and r["ttft_ms"] > 0 for r in records)
    assert all(r["itl_max_ms"] is not None and 0 <= r["itl_max_ms"] <= r["latency_ms"] for r in records)
    assert {r["conversation_id"] for r in records if r["leg"] == "on"} == {"on-L128-c0", "on-L512-c0"}
    report = (out / "report.md").read_text()
    assert "simulated engines" in report and "**FAIL**: KV reuse on 0 of 4" in report
    assert (out / "ttft_vs_length.png").stat().st_size > 0 and (out / "prefill_split.png").stat().st_size > 0
    # It was running before the bench: it runs after it, as the topology file describes it.
    assert _router_up(sim_topology)

    again = CliRunner().invoke(app, ["bench", "-t", str(sim_topology), *SHORT, "--no-redeploy",
                                     "--out", str(tmp_path / "again"), "--json"])
    assert again.exit_code == 0, again.output
    single = json.loads(again.stdout)
    assert [leg["name"] for leg in single["legs"]] == [load(sim_topology).name]
    assert single["legs"][0]["bidirectional"] is True and single["legs"][0]["hit_rate"] == 1.0
    assert _router_up(sim_topology)


def test_a_leg_that_cannot_deploy_fails_alone_and_a_stopped_deployment_stays_stopped(
    sim_topology: Path, tmp_path: Path
) -> None:
    args = ["bench", "-t", str(sim_topology), "--lengths", "128", "--conversations", "1", "--turns", "2",
            "--user-tokens", "8", "--output-tokens", "2", "--api", "completions", "--rate", "50",
            "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*args, "--leg", "bad:sim.args=['--speed','0']", "--leg", "on"])
    assert result.exit_code == 1, result.output
    assert "leg bad FAILED: could not deploy: " in result.stdout
    assert "--speed must be > 0" in result.stdout
    assert "leg on: passed" in result.stdout and "bench FAILED" in result.stdout
    assert not _router_up(sim_topology)
    refused = CliRunner().invoke(app, [*args, "--no-redeploy"])
    assert refused.exit_code == 2
    assert "is not running" in refused.stderr and "pdctl up -t" in refused.stderr
