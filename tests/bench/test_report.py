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
