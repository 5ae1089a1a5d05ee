"""Capacity runs: the SLO arithmetic and search on their own, then a sweep and a search through `pdctl bench` on a
tiny simulated deployment, with the goodput plot and the table in the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.bench.results.records import RequestRecord
from pdctl.bench.runner import capacity
from pdctl.bench.runner.capacity import Point, Slo
from pdctl.bench.runner.collect import EngineUsage
from pdctl.cli import app
from pdctl.errors import UsageError

SLO = Slo(ttft_p90=500, itl_p99=200)


def fake_play(limit: int, calls: list[int]) -> capacity.Play:
    """A deployment that holds `limit` sessions: warm TTFT 100 ms up to it, 1 s beyond."""

    def play(n: int, run: int = 0) -> list[RequestRecord]:
        calls.append(n)
        ttft = 100.0 if n <= limit else 1000.0
        return [RequestRecord("x", n, f"s{i}", t, "completions", status=200, ttft_ms=ttft, itl_max_ms=50.0)
                for i in range(n) for t in range(2)]
    return play


def test_slo_and_sweep_parsing() -> None:
    assert Slo.parse("ttft_p90=500,itl_p99=200") == SLO
    assert capacity.parse_sweep("sessions=8,1,2,2") == (1, 2, 8)
    with pytest.raises(UsageError) as e:
        Slo.parse("ttft_p95=3")
    assert e.value.message == "--slo 'ttft_p95=3' is not KEY=MS with KEY one of ttft_p50, ttft_p90, itl_p99"
    with pytest.raises(UsageError) as e:
        capacity.parse_sweep("clients=1,2")
    assert e.value.message == "--sweep 'clients=1,2' is not sessions=N,N,..."


def test_a_point_is_over_warm_turns_and_failures_put_it_outside() -> None:
    recs = [RequestRecord("x", 2, "a", 0, "completions", status=200, ttft_ms=5000.0, itl_max_ms=10.0),
            RequestRecord("x", 2, "a", 1, "completions", status=200, ttft_ms=100.0, itl_max_ms=30.0),
            RequestRecord("x", 2, "b", 1, "completions", status=200, ttft_ms=300.0, itl_max_ms=20.0)]
    p = capacity.point("x", 2, recs)
    assert (p.ttft_p50, p.ttft_p90, p.itl_max, p.failed) == (200.0, 280.0, 30.0, 0)
    assert p.within(SLO)
    failed = capacity.point("x", 2, [*recs, RequestRecord("x", 2, "c", 1, "completions", status=429)])
    assert failed.failed == 1 and not failed.within(SLO)


def test_search_doubles_then_bisects_to_the_largest_n_within() -> None:
    calls: list[int] = []
    points = capacity.search("x", fake_play(11, calls), SLO)
    assert calls == [1, 2, 4, 8, 16, 12, 10, 11]
    assert capacity.largest_within(points, SLO) == 11
    lines = capacity.table(points, SLO)
    assert "| x | 11 |" in lines and lines[-3] == "| leg | sessions within SLO |"


def test_largest_within_stops_at_the_first_point_outside() -> None:
    pts = [Point("x", n, 1, 0, 1.0, ok, 1.0, 1.0) for n, ok in ((1, 100.0), (2, 900.0), (4, 100.0))]
    assert capacity.largest_within(pts, SLO) == 1
    assert capacity.largest_within([Point("x", 1, 1, 0, 1.0, math.nan, 1.0, 1.0)], Slo(ttft_p90=5)) == 0


class FakeMeter:
    """Two engines whose busy fraction grows with the point's session count; the decode's KV mark is set at 2."""

    def __init__(self) -> None:
        self.spans: list[float] = []
        self.n = 0

    def start(self) -> None:
        self.n += 1

    def stop(self, span_ms: float) -> tuple[EngineUsage, ...]:
        self.spans.append(span_ms)
        return (EngineUsage("prefill-0", 0.1 * self.n, 100, 0, 0.05, True),
                EngineUsage("decode-0", 0.2 * self.n, 10, 200, 0.5, self.n <= 2))


def test_each_point_records_its_engines_and_the_table_shows_busy_and_kv_peak() -> None:
    meter = FakeMeter()
    points = capacity.sweep("x", fake_play(2, []), [1, 2, 4], time_scale=4.0, meter=meter)
    assert len(meter.spans) == 3 and all(s >= 0 for s in meter.spans)
    assert [p.engines[1].busy for p in points] == [0.2, 0.4, pytest.approx(0.6)]
    assert Point.from_json(points[1].to_json()) == points[1] == Point(**points[1].to_json())
    lines = capacity.table(points, SLO)
    assert lines[0].endswith("| largest gap | GPU busy % | KV peak % | within SLO |")
    assert lines[1] == "|---|---|---|---|---|---|---|---|---|---|---|"
    assert lines[2] == "| x | 1 | 2 | 0 | 400 | 400 | 200 | 200 | P0 10, D0 20 | P0 5, D0 50 | yes |"
    assert lines[4] == "| x | 4 | 8 | 0 | 4000 | 4000 | 200 | 200 | P0 30, D0 60 | P0 5, D0 ≤50 | no |"
    # engines without the sim's counters (a real vLLM): "-", and no columns at all when no point has any
    bare = Point("x", 1, 1, 0, 1.0, 1.0, 1.0, 1.0, (EngineUsage("decode-0", None, None, None, None),))
    assert capacity.table([bare], SLO)[2].endswith("| 1 | 1 | - | - | yes |")
    assert "GPU busy %" not in capacity.table([Point("x", 1, 1, 0, 1.0, 1.0, 1.0, 1.0)], SLO)[0]
    assert "engines" not in Point("x", 1, 1, 0, 1.0, 1.0, 1.0, 1.0).to_json()


AGENT = ["--turns", "3", "--output-tokens", "4", "--system-tokens", "64", "--tool-tokens", "8-24",
         "--think-s", "0.2-0.5", "--arrival-rate", "5"]


@pytest.mark.slow
def test_a_sweep_and_a_search_through_bench(sim_topology: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    legs = ["--leg", "on:connector.bidirectional_kv_xfer=true", "--leg", "agg:mode=aggregated"]
    args = ["bench", "-t", str(sim_topology), *AGENT, "--sweep", "sessions=1,3", "--slo", "ttft_p90=60000",
            "--out", str(out), "--json", "--set", "sim.args=[--step-model, h200-graphs]", "--runs", "1", *legs]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "legs.json").read_text())
    assert data["workload"]["profile"] == "agent" and data["workload"]["slo"] == {"ttft_p90": 60000.0}
    on, agg = data["legs"]
    assert [p["sessions"] for p in on["capacity"]] == [1, 3] == [p["sessions"] for p in agg["capacity"]]
    assert all(p["requests"] == 3 * p["sessions"] and p["failed"] == 0 for p in on["capacity"] + agg["capacity"])
    # each engine's modelled busy fraction, tokens and KV mark per point, from the sim's step counters
    assert [[e["engine"] for e in p["engines"]] for p in on["capacity"]] == [["prefill-0", "decode-0"]] * 2
    assert [[e["engine"] for e in p["engines"]] for p in agg["capacity"]] == [["aggregated-0"]] * 2
    for p in on["capacity"] + agg["capacity"]:
        assert all(0 < e["busy"] < 1 and 0 < e["kv_peak"] < 1 for e in p["engines"])
        assert all(e["steps"] > 0 for e in p["engines"])
    prefill, decode = on["capacity"][1]["engines"]
    # 9 turns at 3 sessions: the prefill samples each turn's first token in its last prompt step; the decode
    # computes what it did not pull, samples the first token again and decodes the other 3 of the 4 output tokens
    assert prefill["decode_tokens"] == 0 < decode["prefill_tokens"] < prefill["prefill_tokens"]
    assert decode["decode_tokens"] == 9 * 3
    (one,) = agg["capacity"][1]["engines"]
    assert one["prefill_tokens"] > 0 and one["decode_tokens"] == 9 * 3
    records = json.loads((out / "requests.json").read_text())
    assert {r["reuse"] for r in records if r["leg"] == "on" and r["turn"] >= 1} == {"hit"}
    # the prefills' D->P reads metered per point (issue 41: the demo's KV table said `transfers 0` beside 0.96 per
    # warm turn), as many as the turns that reported reading
    for n in (1, 3):
        kv = on["kv_transfer_by_length"][str(n)]
        reads = sum(1 for r in records if r["leg"] == "on" and r["length"] == n and r["reuse_read"])
        assert kv["source"] == "metrics" and kv["transfers"] == reads, (n, kv, reads)
    assert on["kv_transfer"]["transfers"] == sum(on["kv_transfer_by_length"][k]["transfers"] for k in ("1", "3"))
    # sessions share the system prompt and each turn's prompt extends the last
    assert len({r["conversation_id"] for r in records if r["leg"] == "agg"}) == 4
    report = (out / "report.md").read_text()
    assert "## Capacity: agent sessions per leg (simulated)" in report
    assert "| on | 3 |" in report and "| agg | 3 |" in report  # the largest N within the SLO per leg
    assert "| largest gap | GPU busy % | KV peak % | within SLO |" in report
    assert (out / "goodput.png").stat().st_size > 0

    searched = tmp_path / "search"
    result = CliRunner().invoke(app, ["bench", "-t", str(sim_topology), *AGENT, "--slo", "ttft_p90=0.001",
                                      "--out", str(searched), "--json", "--leg", "agg:mode=aggregated"])
    assert result.exit_code == 0, result.output
    (agg,) = json.loads((searched / "legs.json").read_text())["legs"]
    assert [p["sessions"] for p in agg["capacity"]] == [1]  # outside already at one session: nothing within
    assert "| agg | 0 |" in (searched / "report.md").read_text()


def fig(ttft_p90: float, itl_p99: float, failed: int = 0) -> Point:
    return Point("x", 4, 8, failed, ttft_p90 / 2, ttft_p90, itl_p99, itl_p99)


def test_the_repeat_rule_asks_a_third_run_only_when_two_disagree() -> None:
    a, near, far = fig(400, 100), fig(430, 105), fig(600, 100)
    assert capacity.agree(a, near) and not capacity.agree(a, far)  # 7 % and 5 % apart; 33 % apart
    assert not capacity.agree(a, fig(400, 100, failed=1))  # one run failed a request, the other did not
    assert capacity.another_run([], 2) and capacity.another_run([a], 2)
    assert not capacity.another_run([a, near], 2)
    assert capacity.another_run([a, far], 2)
    assert not capacity.another_run([a, far, near], 2)  # never a fourth
    assert not capacity.another_run([a], 1)  # one run wanted: no rule
    # the SLO's own keys decide: only TTFT p90 named, an ITL twice as large still agrees
    assert capacity.agree(a, fig(410, 200), slo=Slo(ttft_p90=500))
    assert not capacity.agree(a, fig(410, 200), slo=SLO)
    assert capacity.kept_runs([a, far, near]) == (0, 2)
    assert capacity.kept_runs([far, a, fig(620, 101)]) == (0, 2)


def test_a_point_that_disagrees_is_played_a_third_time_and_pools_the_two_that_agree() -> None:
    calls: list[tuple[int, int]] = []

    def play(n: int, run: int = 0) -> list[RequestRecord]:
        calls.append((n, run))
        ttft = 900.0 if run == 1 else 100.0 + run  # run 1 is an outlier
        return [RequestRecord("x", n, f"s{i}-r{run}", t, "completions", status=200, ttft_ms=ttft, itl_max_ms=50.0)
                for i in range(n) for t in range(2)]

    p = capacity.measured("x", play, 3, runs=2, slo=SLO)
    assert calls == [(3, 0), (3, 1), (3, 2)]
    assert p.agreed is True and p.requests == 12  # runs 1 and 3 pooled: 2 x 3 sessions x 2 turns
    assert [r["kept"] for r in p.runs] == [1.0, 0.0, 1.0] and p.ttft_p90 == 102.0  # not 900: run 2 left out
    assert p.load is not None and capacity.runs_cell(p) == "3, kept 1+3"
    assert Point(**p.to_json()) == Point.from_json(json.loads(json.dumps(p.to_json())))
    calls.clear()
    steady = capacity.measured("x", lambda n, run=0: play(n, 0), 2, runs=2, slo=SLO)
    assert len(calls) == 2 and steady.agreed is True and capacity.runs_cell(steady) == "2, agree"
