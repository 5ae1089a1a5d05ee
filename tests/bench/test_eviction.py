"""The eviction profile: sessions sized against the prefills' KV, its legs (the aggregated one on the same GPUs), and
`pdctl bench --profile evict` end to end on simulated engines with a small sweep, writing capacity.json."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from pdctl.bench.leg.legs import leg_topology
from pdctl.bench.runner import eviction
from pdctl.bench.traffic.agent import AgentSpec, Range
from pdctl.cli import app
from pdctl.plan import plan
from pdctl.topology import load

SMALL = AgentSpec(sessions=1, turns=3, system_tokens=64, task_tokens=300, tool_tokens=Range(8, 24), output_tokens=4)


def test_sessions_are_sized_against_the_prefills_kv() -> None:
    assert eviction.own_tokens(SMALL) == 300 + 2 * (4 + 16)
    # 640 tokens of KV, 64 shared: one session's own 340 fits, two do not
    size = eviction.size([640], SMALL)
    assert (size.evict_from, size.evicts(1), size.evicts(2)) == (2, False, True)
    assert "histories exceed the prefills' KV from 2 sessions" in size.describe()
    two = eviction.size([640, 640], SMALL)  # the shared prefix on each prefill, each session's own part once
    assert two.evict_from == (2 * 640 - 2 * 64) // 340 + 1 == 4
    unknown = eviction.size([640, None], SMALL)
    assert unknown.evict_from == 0 and unknown.evicts(8) is None and "unknown" in unknown.describe()


def test_the_aggregated_leg_runs_one_engine_per_gpu_set_of_the_pd_instances(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text("""name: evict-gpu
engine: vllm
nodes: [{name: g, address: 127.0.0.1, transport: local, gpus: 2}]
model: {id: Qwen/Qwen3-8B, served_name: Qwen, gpu_memory_utilization: 0.45}
prefill: [{node: g, gpus: [0], port: 8100, side_channel_port: 5600}]
decode:
  - {node: g, gpus: [0], port: 8200, side_channel_port: 5601}
  - {node: g, gpus: [1], port: 8300, side_channel_port: 5602}
router: {node: g, port: 8000}
python: {venv: null}
""")
    leg = eviction.aggregated_leg(load(gpu))
    assert leg.overrides[0] == "mode=aggregated"
    assert leg.overrides[2] == "model.gpu_memory_utilization=0.9"  # prefill and decode shared GPU 0
    topo = leg_topology(gpu, [], leg)
    assert [(i.gpus, i.port) for i in topo.decode] == [([0], 8100), ([1], 8300)]
    assert [s.role for s in plan(topo)] == ["decode", "decode", "router"]
    names = [x.name for x in eviction.legs(load(gpu))]
    assert names == ["off", "on-prefill", "on", "agg"]


AGENT = ["--turns", "3", "--output-tokens", "4", "--system-tokens", "64", "--tool-tokens", "8-24",
         "--think-s", "0.2-0.5", "--arrival-rate", "5"]


@pytest.mark.slow
def test_the_eviction_profile_end_to_end_writes_capacity_json(sim_topology: Path, tmp_path: Path) -> None:
    out = tmp_path / "evict"
    # each prefill holds 40 blocks of 16 tokens: two sessions' histories do not fit
    args = ["bench", "-t", str(sim_topology), "--profile", "evict", *AGENT, "--sweep", "sessions=1,2",
            "--slo", "ttft_p90=60000,itl_p99=60000", "--set", "extra_args.prefill=[--num-gpu-blocks, '40']",
            "--out", str(out), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["simulated"] is True and doc["slo"] == {"ttft_p90": 60000.0, "itl_p99": 60000.0}
    assert doc["eviction"] == {"prefill_kv_tokens": [640], "shared_tokens": 64, "session_tokens": 340,
                               "evict_from": 2}
    host = doc["host"]
    assert host["cpus"] >= 1 and len(host["load_average_start"]) == 3 and len(host["load_average_end"]) == 3
    legs = {leg["leg"]: leg for leg in doc["legs"]}
    assert list(legs) == ["off", "on-prefill", "on", "agg"]
    assert [legs[n]["shape"] for n in legs] == ["1P1D", "1P1D", "1P1D", "2 aggregated"]
    # legs labelled by where their warm turns' KV came from, counted from the router's per-turn header
    assert legs["off"]["path"] == "OFF" and legs["agg"]["path"] == "aggregated"
    assert "decode_read" not in legs["off"]["kv_sources"]
    assert legs["on-prefill"]["kv_sources"].get("decode_read", 0) > 0
    assert "bidirectional" in legs["on-prefill"]["path"]
    for leg in legs.values():
        assert sum(leg["kv_sources"].values()) == leg["warm_turns"] > 0
        assert leg["sessions_within_slo"] == 2  # the SLO is wide: every point within it
        points = leg["points"]
        assert [p["sessions"] for p in points] == [1, 2] and [p["evicts"] for p in points] == [False, True]
        for p in points:
            # two runs, a third where they disagreed; the two kept are pooled
            assert len(p["runs"]) in (2, 3) and sum(r["kept"] for r in p["runs"]) == 2
            assert len(p["runs"]) == 3 or p["agreed"] is True  # two runs only when they agreed
            assert p["requests"] == 2 * 3 * p["sessions"] and p["load"] >= 0
            assert all(e["cpu"] is not None and e["cpu"] >= 0 for e in p["engines"])
        assert [sum(p["kv_sources"].values()) for p in points] == [2 * len(p["runs"]) * p["sessions"]
                                                                   for p in points]  # every run's warm turns
        assert {k: sum(p["kv_sources"].get(k, 0) for p in points) for k in leg["kv_sources"]} == leg["kv_sources"]
    assert doc["ratios"]["on/off"] == 1.0 and doc["ratios"]["on/agg"] == 1.0
    # what the router chose for each warm turn (X-PD-KV-Choice), beside what ran: none on OFF and the aggregated
    # engines, a D->P read or a recompute on the ON legs (local_prefill_tokens 0: never the decode alone)
    for name in ("off", "agg"):
        assert legs[name]["kv_choice"]["chosen"] == {"none": legs[name]["warm_turns"]}, legs[name]["kv_choice"]
    for name in ("on-prefill", "on"):
        chose = legs[name]["kv_choice"]
        assert chose["warm_turns"] == legs[name]["warm_turns"] == sum(chose["chosen"].values())
        # every warm turn kept its handle on the decode (4000 blocks): each got a choice
        assert chose["chosen"].get("decode_read", 0) > 0 and set(chose["chosen"]) <= {"decode_read", "recomputed"}, \
            chose
        assert sum(chose["basis"].values()) == sum(n for s, n in chose["chosen"].items() if s != "none")
        assert chose["by_source"]["decode_read"]["turns"] == chose["chosen"]["decode_read"]
        for p in legs[name]["points"]:
            assert sum(p["kv_choice"].values()) == sum(p["kv_sources"].values())
    requests = json.loads((out / "requests.json").read_text())
    for r in requests:
        chosen = r["kv_choice"]
        if r["turn"] == 0 or r["leg"] in ("off", "agg"):
            assert chosen is None and r["kv_choice_predicted_ms"] is None, r
        else:
            assert chosen in ("decode_read", "recomputed") and r["kv_choice_basis"] in ("model", "default"), r
            assert (r["kv_choice_predicted_ms"] is not None) == (r["kv_choice_basis"] == "model"), r
    assert any(r["kv_choice"] == "decode_read" and r["ttft_ms"] for r in requests if r["leg"] == "on-prefill")
    ids = {r["conversation_id"] for r in requests if r["leg"] == "on"}
    assert any("-r1-" in i for i in ids) and any("-r1-" not in i for i in ids)  # each run's own sessions
    report = (out / "report.md").read_text()
    assert "Eviction profile: prefill KV 640 tokens" in report and "`capacity.json`" in report
    assert "| on-prefill | 1P1D | ON" in report and "| runs |" in report
    assert "| KV sources (what ran) | router chose |" in report and "## KV source the router chose" in report
    # the deployment is down again after the bench
    for leg in ("off", "agg"):
        topo = load(sim_topology, list(eviction.legs(load(sim_topology))[0 if leg == "off" else 3].overrides))
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{topo.router.port}/health", timeout=2)
