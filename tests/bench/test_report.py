from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

import pytest

from pdctl.bench.output import report
from pdctl.bench.results.records import BenchResult, KvTransfer, LegResult, RequestRecord
from pdctl.bench.results.stats import percentile, ratios, summarize
from tests.bench.recorded import bench

PNG = b"\x89PNG\r\n\x1a\n"


def test_report_files_from_the_real_h200_run(tmp_path: Path) -> None:
    files = report.write(bench(), tmp_path / "out")
    for path in (files.requests, files.legs, files.summary, files.ttft_png, files.prefill_png, files.report):
        assert path.exists() and path.stat().st_size > 0, path
    assert files.ttft_png.read_bytes()[:8] == PNG and files.prefill_png.read_bytes()[:8] == PNG
    rows = list(csv.DictReader(files.summary.open()))
    warm = {(r["leg"], int(r["length"])): r for r in rows if r["scope"] == "warm"}
    assert set(warm) == {(leg, n) for leg in ("off", "on") for n in (2000, 8000, 16000, 24000)}
    # The anchor: median TTFT of turns 2-3 at 24.6k tokens, OFF 3816 ms and ON 663 ms.
    assert float(warm[("off", 24000)]["ttft_median_ms"]) == pytest.approx(3816, abs=1)
    assert float(warm[("on", 24000)]["ttft_median_ms"]) == pytest.approx(663, abs=1)
    assert float(warm[("on", 2000)]["hit_rate"]) == 1.0 and float(warm[("off", 2000)]["hit_rate"]) == 0.0
    assert int(warm[("off", 8000)]["requests"]) == 4
    md = files.report.read_text()
    assert "simulated" not in md.lower()
    assert "| on | 16 | 16 | 0 | 0 | 100% |" in md
    assert "off/on" in md and "ttft_vs_length.png" in md and "prefill_split.png" in md
    # the recorded prefill hop is 80 % of each TTFT, so the decode's part is the mean of the other 20 %
    on_24k = [r.ttft_ms for r in bench().legs[1].records if r.length == 24000 and r.turn >= 1]
    row = next(line for line in md.split("## After the prefill")[1].splitlines() if line.startswith("| 24000 |"))
    assert row.strip(" |").split(" | ")[2] == f"{0.2 * sum(on_24k) / len(on_24k):.1f}"


def test_ratio_grows_with_length_on_the_real_run() -> None:
    result = bench()
    r = ratios(summarize(result.legs), ["off", "on"])["on"]
    assert r[2000] < r[8000] < r[16000] < r[24000]
    assert r[24000] > 4


def test_simulated_runs_say_so_in_every_title(tmp_path: Path) -> None:
    files = report.write(bench(simulated=True), tmp_path)
    md = files.report.read_text()
    assert md.splitlines()[0].endswith("simulated engines (pdctl.sim)")
    assert "**Simulated engines**" in md
    from pdctl.bench.output import plots

    assert plots.label(bench(simulated=True)) == "simulated engines (pdctl.sim)"


def test_prefill_split_uses_the_kv_transfer_per_reusing_turn() -> None:
    from pdctl.bench.output import plots

    result = bench()
    splits = plots.prefill_splits(result, summarize(result.legs))
    on = [s for s in splits if s.leg == "on"]
    off = [s for s in splits if s.leg == "off"]
    assert all(s.kv_ms == 0 for s in off)
    assert all(s.kv_ms == pytest.approx(2400.0 / 16) for s in on)
    assert all(s.compute_ms == pytest.approx(s.total_ms - s.kv_ms) for s in on)


def test_percentile_matches_numpy_linear() -> None:
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([5], 90) == 5


def test_summary_table_renders_means_ratios_and_hit_rates() -> None:
    from rich.console import Console

    from pdctl.bench.output.render import summary_table

    console = Console(width=100, color_system=None, record=True, file=io.StringIO())
    console.print(summary_table(bench()))
    text = console.export_text()
    assert text.splitlines()[0].rstrip() == "Mean TTFT of turns 2+ (ms) — vLLM"
    row = next(line for line in text.splitlines() if "24000" in line)
    assert [c.strip() for c in row.strip("│ ").split("│")] == ["24000", "3826", "679", "5.64"]
    hits = next(line for line in text.splitlines() if "hit rate" in line)
    assert "0%" in hits and "100%" in hits


def test_turns_the_decode_ran_alone_are_counted_as_hits_and_shown() -> None:
    from dataclasses import replace

    from pdctl.bench.results.stats import reuse_counts

    result = bench()
    on = result.legs[1]
    on.records = [replace(r, reuse_reason="decode_local", prefill_ms=0.0) if r.turn == 1 else r for r in on.records]
    c = reuse_counts(on.records)
    warm_1 = sum(1 for r in on.records if r.turn == 1)
    assert c.local == warm_1 > 0 and c.rate == 1.0
    assert reuse_counts(result.legs[0].records).local == 0
    row = next(line for line in report._reuse_section(result.legs) if line.startswith("| on |"))
    assert row.split(" | ")[6] == str(warm_1)


def test_the_report_splits_warm_ttft_into_stages_with_a_stacked_plot(tmp_path: Path) -> None:
    from pdctl.bench.results.records import BenchResult, KvTransfer, LegResult, RequestRecord

    def rec(turn: int) -> RequestRecord:
        return RequestRecord(leg="on", length=2000, conversation_id="c", turn=turn, api="chat", status=200,
                             ttft_ms=100.0, prefill_ms=40.0, router_in_ms=5.0, decode_ms=50.0, reuse="hit")

    leg = LegResult("on", [], True, True, records=[rec(0), rec(1), rec(2)])
    leg.kv_by_length[2000] = KvTransfer(transfers=2, xfer_ms=20.0, source="metrics")  # 10 ms per reusing turn
    leg.pull_by_length[2000] = KvTransfer(transfers=3, xfer_ms=18.0, source="metrics")  # 6 ms per pull
    files = report.write(BenchResult("t", True, {}, [leg]), tmp_path / "out")
    assert files.stages_png.read_bytes()[:8] == PNG
    md = files.report.read_text()
    assert "| leg | length | turns | TTFT | router in | prefill hop | D->P read | P->D pull | decode first token | " \
           "router out |" in md
    # in 5, prefill 40 = 30 + read 10, decode 50 = pull 6 + 44, out = 100 - 5 - 40 - 50
    assert "| on | 2000 | 2 | 100.0 | 5.0 | 30.0 | 10.0 | 6.0 | 44.0 | 5.0 |" in md
    assert "ttft_stages.png" in md


def _warm_leg(name: str, bidirectional: bool, reason: str, outcome: str = "hit", read: int | None = None,
              transfers: int = 0, nbytes: float = 0.0) -> LegResult:
    recs = [RequestRecord(leg=name, length=2000, conversation_id=f"c{i}", turn=t, api="chat", status=200,
                          ttft_ms=100.0, output_num_tokens=8, reuse=outcome if t else "miss",
                          reuse_reason=reason if t else "new_conversation", reuse_read=read if t else None)
            for i in range(4) for t in range(3)]
    leg = LegResult(name, [], bidirectional, True, records=recs)
    leg.kv = KvTransfer(transfers=transfers, bytes=nbytes, source="metrics")
    return leg


@pytest.mark.parametrize(("reason", "read"), [("decode_local", None), ("prefill_cached", 0), ("verified", None)])
def test_a_leg_that_moved_no_kv_cannot_be_labelled_bidirectional(tmp_path: Path, reason: str,
                                                                 read: int | None) -> None:
    """Issue 29: the demo's "ON" leg ran every warm turn on the decode alone (0 transfers, 0 GiB) while its plots
    said "bidirectional on". Whatever its turns' headers say, a leg that moved nothing from a decode is flagged,
    and neither its label, its plot titles nor its table row calls it bidirectional."""
    from pdctl.bench.output import plots
    from pdctl.bench.results import paths

    off, on = _warm_leg("off", False, "not_eligible", "miss"), _warm_leg("on", True, reason, read=read)
    result = BenchResult("t", True, {}, [off, on])
    p = paths.leg_path(on)
    assert not p.moved_kv and p.flag is not None and "moved no KV" in p.flag
    assert "bidirectional" not in p.label.lower() and "via prefill" not in p.label, p.label
    assert "bidirectional" not in plots._leg_label(on).lower()
    assert "bidirectional" not in plots.title_suffix([on]).lower()
    md = report.write(result, tmp_path / "out").report.read_text()
    assert "**Flag**: leg on has bidirectional_kv_xfer on but moved no KV" in md
    row = next(line for line in md.splitlines() if line.startswith("| on | (as deployed) |"))
    assert "bidirectional" not in row.split(" | ")[-1].lower(), row
    assert paths.leg_path(off).label == "off: OFF" and paths.leg_path(off).flag is None


def test_a_leg_that_read_from_its_decodes_is_labelled_by_its_measured_shares() -> None:
    from pdctl.bench.results import paths

    on = _warm_leg("on", True, "verified", read=700, transfers=8, nbytes=8 * 2**30)
    p = paths.leg_path(on)
    assert p.moved_kv and p.flag is None and p.transfers_per_turn == 1.0 and p.gib_per_turn == 1.0
    assert p.label == "on: ON via prefill (bidirectional) (D->P read 100%)"
    on.records[4] = replace(on.records[4], reuse_reason="decode_local", reuse_read=None)
    p = paths.leg_path(on)
    assert p.path == "ON mixed (bidirectional)" and "D->P read 88%" in p.label and "local 12%" in p.label
    assert "transfers / warm turn | GiB / warm turn" in "\n".join(report._reuse_section([on]))


def test_an_unmetered_leg_counts_the_reads_its_turns_reported() -> None:
    """A capacity leg meters no prefill transfers (source none): the turns' read= say what moved, GiB unknown."""
    import math

    from pdctl.bench.results import paths

    on = _warm_leg("on", True, "verified", read=700)
    on.kv = KvTransfer()
    p = paths.leg_path(on)
    assert p.moved_kv and p.flag is None and p.transfers_per_turn == 1.0 and math.isnan(p.gib_per_turn)
    assert "| - |" in "\n".join(report._reuse_section([on]))
    on.records = [replace(r, reuse_reason="decode_local", reuse_read=None) for r in on.records]
    assert paths.leg_path(on).flag is not None


def _eviction_leg(name: str, bidirectional: bool) -> LegResult:
    """A leg of the demo's eviction case as the bench records it: sessions 4 and 16, 4 turns each, the records'
    `length` their point's sessions, the prefills' D->P reads metered per point. OFF: at 4 sessions the prefill's
    cache holds every warm turn's history, at 16 only the shared system prompt (2048 tokens). ON: warm turns on
    their decode alone, except every fourth at 16 sessions, read back from the decode (8000 tokens)."""
    from pdctl.bench.runner.capacity import point

    leg = LegResult(name, [f"connector.bidirectional_kv_xfer={str(bidirectional).lower()}"], bidirectional, True)
    for n in (4, 16):
        recs: list[RequestRecord] = []
        for s in range(n):
            for t in range(4):
                history = 8000 + 1000 * t
                r = RequestRecord(name, n, f"{name}-n{n}-s{s}", t, "completions", status=200,
                                  ttft_ms=(100.0 if n == 4 or bidirectional else 1000.0) + s, itl_max_ms=30.0,
                                  input_num_tokens=history + 900, output_num_tokens=100, reuse="miss",
                                  reuse_reason="new_conversation")
                if t and not bidirectional:
                    r = replace(r, reuse_reason="no_handle_returned", reuse_cached=history if n == 4 else 2048)
                elif t and n == 16 and s % 4 == 0:
                    r = replace(r, reuse="hit", reuse_reason="verified", reuse_read=8000, reuse_cached=history)
                elif t:
                    r = replace(r, reuse="hit", reuse_reason="decode_local")
                recs.append(r)
        reads = sum(1 for r in recs if r.reuse_read)
        kv = KvTransfer(transfers=reads, xfer_ms=5.0 * reads, bytes=reads * 2**29, source="metrics")
        leg.kv_by_length[n], leg.kv = kv, leg.kv + kv
        leg.records += recs
        leg.capacity.append(point(name, n, recs, time_scale=3.0).to_json())
    return leg


def _eviction_result() -> BenchResult:
    workload = {"profile": "agent", "api": "completions", "turns": 4, "sessions": [4, 16],
                "slo": {"ttft_p90": 500.0}}
    return BenchResult("demo-x-eviction", True, workload, [_eviction_leg("off", False), _eviction_leg("on", True)])


def test_the_demos_eviction_case_is_reported_on_sessions_with_one_account_of_the_kv(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: the demo's second case showed `length 8` and one dot at x=8 on a "prompt length" axis (8 was its
    number of sessions), `transfers 0` beside `0.96 per warm turn`. Its report's tables and plots are on sessions,
    its transfers and per-warm-turn figures come from one meter, and each leg's path is named."""
    from pdctl.bench.output import plots

    drawn: dict[str, tuple[str, list[list[float]]]] = {}

    def keep(plt: object, fig: object, path: Path) -> None:
        ax = fig.axes[0]  # type: ignore[attr-defined]
        drawn[path.name] = (ax.get_xlabel(), [list(line.get_xdata()) for line in ax.get_lines()])
        plt.close(fig)  # type: ignore[attr-defined]

    monkeypatch.setattr(plots, "_save", keep)
    md = report.write(_eviction_result(), tmp_path / "eviction").report.read_text()
    assert "| length |" not in md and "prompt length" not in md
    assert "| sessions | off | on | off/on |" in md  # warm TTFT
    assert md.count("| sessions | off | on |") == 4  # warm, cold, prefill, after the prefill
    assert "| leg | sessions | turns | TTFT |" in md  # the stages
    for png in (plots.TTFT_PNG, plots.PREFILL_PNG, plots.STAGES_PNG, plots.GOODPUT_PNG):
        assert drawn[png][0] == "concurrent agent sessions", (png, drawn[png])
    assert drawn[plots.TTFT_PNG][1] == [[4, 16], [4, 16]]  # one point per number of sessions, per leg
    # The legs' measured paths, named
    legs = {line.split(" | ")[0].lstrip("| "): line for line in md.split("## Legs")[1].splitlines()[4:6]}
    assert legs["off"].endswith("| OFF |")
    assert legs["on"].endswith("| ON mixed (bidirectional) (local 80%, D->P read 20%) |"), legs["on"]
    # One account of the KV moved: 12 reads over the on leg's 60 warm turns, 6 GiB
    row = next(line for line in md.split("## KV reuse")[1].splitlines() if line.startswith("| on |"))
    cells = row.strip(" |").split(" | ")
    assert cells[1] == "60" and cells[8:12] == ["12", "6.00", "0.20", "0.100"], cells
    off = next(line for line in md.split("## KV reuse")[1].splitlines() if line.startswith("| off |"))
    assert off.strip(" |").split(" | ")[8:12] == ["0", "0.00", "0.00", "0.000"], off
    # One account of the path: the report's share from the prefill's cache is summary.json's path mix (12 of the
    # off leg's 60 warm turns; at 16 sessions its cache held only the shared prompt, so those recomputed)
    assert off.strip(" |").split(" | ")[7] == "20%", off


def test_the_demos_eviction_summary_json(tmp_path: Path) -> None:
    """summary.json beside the case's report: per leg and number of sessions, warm-turn TTFT p50/p90 (the capacity
    points', modelled), the KV read back per warm turn from the same meter as the report, and the path mix; a
    prefill-cache turn whose cache held only the shared prefix counts as a recompute."""
    import json

    from pdctl import demo_summary

    result = _eviction_result()
    summary = demo_summary.capacity_summary(result, "eviction")
    data = json.loads(demo_summary.write(summary, tmp_path).read_text())
    assert (tmp_path / "summary.json").exists()
    assert (data["case"], data["axis"], data["simulated"]) == ("eviction", "sessions", True)
    assert data["time"] == "modelled ms (wall x sim.speed)" and data["slo"] == "ttft_p90 <= 500 ms"
    (off, on) = data["legs"]
    assert (off["leg"], off["path"], on["leg"], on["path"]) == ("off", "OFF", "on", "ON mixed (bidirectional)")
    assert [p["sessions"] for p in off["points"]] == [4, 16] == [p["sessions"] for p in on["points"]]
    warm_off16 = [3 * (r.ttft_ms or 0) for r in result.legs[0].records if r.length == 16 and r.turn]
    assert off["points"][1]["ttft_p50_ms"] == round(percentile(warm_off16, 50), 1)
    assert off["points"][1]["ttft_p90_ms"] == round(percentile(warm_off16, 90), 1)
    assert [p["warm_turns"] for p in on["points"]] == [12, 48]
    assert [p["path_mix"] for p in off["points"]] == [{"prefill cache": 12}, {"recompute": 48}]
    assert [p["path_mix"] for p in on["points"]] == [{"local": 12}, {"local": 36, "D->P read": 12}]
    assert [p["kv_read_back_per_warm_turn"] for p in on["points"]] == [
        {"transfers": 0.0, "gib": 0.0, "tokens": 0.0}, {"transfers": 0.25, "gib": 0.125, "tokens": 2000.0}]
    assert off["points"][1]["kv_read_back_per_warm_turn"] == {"transfers": 0.0, "gib": 0.0, "tokens": 0.0}
    ratio = data["ttft_p90_ratios"]["on/off"]
    p90s = [leg["points"][1]["ttft_p90_ms"] for leg in (on, off)]
    assert ratio["4"] == 1.0 and ratio["16"] == round(p90s[0] / p90s[1], 3)
    assert demo_summary.ratio_lines(summary)[0].startswith("on/off warm TTFT p90: 4 sessions 1.00x, 16 sessions 0.")


def test_the_demos_first_case_summary_json_is_per_prompt_length(tmp_path: Path) -> None:
    """Case 1's summary.json: one session at a time, a point per prompt length, wall-clock TTFT, the KV the
    prefills metered over the leg's lengths (here the whole leg's, as the recorded run has no per-length meter)."""
    import json

    from pdctl import demo_summary

    result = bench()
    data = json.loads(demo_summary.write(demo_summary.sweep_summary(result, "single client"), tmp_path).read_text())
    assert (data["axis"], data["time"]) == ("length", "wall ms")
    off, on = data["legs"]
    assert [p["length"] for p in off["points"]] == [2000, 8000, 16000, 24000]
    assert {p["sessions"] for p in off["points"] + on["points"]} == {1}
    warm = [r.ttft_ms or 0 for r in result.legs[1].records if r.length == 24000 and r.turn >= 1]
    assert on["points"][3]["ttft_p50_ms"] == round(percentile(warm, 50), 1)
    kv = on["points"][3]["kv_read_back_per_warm_turn"]
    assert kv["gib"] is None and kv["transfers"] is None  # no meter per length: not metered, never 0
    assert set(data["ttft_p90_ratios"]["on/off"]) == {"2000", "8000", "16000", "24000"}
