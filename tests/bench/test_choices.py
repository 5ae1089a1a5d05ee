"""The router's per-turn choice (X-PD-KV-Choice) in the bench's records, aggregated per leg beside what ran: the mix
over warm turns, predicted against measured TTFT per chosen source; in the report, legs.json and capacity.json."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pdctl.bench.output import capacity_file, report
from pdctl.bench.results import choices
from pdctl.bench.results.records import BenchResult, LegResult, RequestRecord
from pdctl.bench.runner.capacity import point


def _turn(conv: str, turn: int, ttft: float, choice: str | None = None, predicted: float | None = None,
          **kw: object) -> RequestRecord:
    rec = RequestRecord("on", 2, conv, turn, "completions", status=200, ttft_ms=ttft, itl_max_ms=20.0,
                        input_num_tokens=1000, output_num_tokens=10, reuse="miss",
                        reuse_reason="new_conversation" if turn == 0 else "evicted")
    if choice is not None:
        rec = replace(rec, kv_choice=choice, kv_choice_basis="model" if predicted is not None else "default",
                      kv_choice_predicted_ms=predicted)
    return replace(rec, **kw)  # type: ignore[arg-type]


def _on_leg() -> LegResult:
    """Four conversations of three turns: the router chose a read for six warm turns (two of them ran from the
    prefill's own cache), recompute for one (refused the decode alone: itl), and sent nothing for the last."""
    recs = []
    for c in range(4):
        recs.append(_turn(f"c{c}", 0, 500.0))
        for t in (1, 2):
            if c == 3 and t == 2:
                recs.append(_turn(f"c{c}", t, 900.0))  # no header: the handle was gone
            elif c == 3:
                recs.append(_turn(f"c{c}", t, 400.0, "recomputed", 200.0, kv_choice_refused="itl"))
            elif c == 2:  # the prefill's own cache held the whole history: nothing read
                recs.append(_turn(f"c{c}", t, 60.0, "decode_read", 50.0, reuse="hit", reuse_reason="prefill_cached",
                                  reuse_cached=1010))
            else:
                recs.append(_turn(f"c{c}", t, 100.0 + 10 * (2 * c + t), "decode_read", 50.0, reuse="hit",
                                  reuse_reason="verified", reuse_read=1000))
    return LegResult("on", [], True, True, records=recs)


def test_a_legs_choices_are_counted_over_its_warm_turns_beside_what_ran() -> None:
    c = choices.of_leg(_on_leg())
    assert c.warm_turns == 8 and c.reported
    assert c.chosen == {"decode_read": 6, "recomputed": 1, "none": 1}
    assert c.shares == {"decode_read": 0.75, "recomputed": 0.125, "none": 0.125}
    assert c.basis == {"model": 7} and c.refused == {"itl": 1}
    assert c.mix == "decode_read 6 (75%), recomputed 1 (12%), none 1 (12%)"
    read, recompute = c.sources
    assert (read.source, read.turns, read.ran) == ("decode_read", 6, {"decode_read": 4, "prefill_cache": 2})
    # predicted 50 on each; measured 60, 60, 110, 120, 130, 140: p50 115, ratio p50 2.3
    assert (read.predicted_turns, read.predicted_p50_ms, read.measured_p50_ms) == (6, 50.0, 115.0)
    assert read.ratio_p50 == pytest.approx(2.3)
    assert (recompute.ran, recompute.predicted_p50_ms, recompute.measured_p50_ms, recompute.ratio_p50) == \
        ({"recomputed": 1}, 200.0, 400.0, 2.0)
    doc = c.to_json()
    assert doc["by_source"]["decode_read"]["measured_over_predicted_p50"] == 2.3
    assert doc["local_refused"] == {"itl": 1} and doc["shares"]["none"] == 0.125


def test_default_choices_have_no_prediction_and_off_legs_report_none() -> None:
    recs = [_turn("a", 0, 500.0), _turn("a", 1, 80.0, "decode_cache", reuse="hit", reuse_reason="decode_local"),
            _turn("a", 2, 90.0, "decode_cache", reuse="hit", reuse_reason="decode_local"),
            replace(_turn("b", 1, 70.0, "decode_cache"), status=500, error="HTTP 500")]  # failed: not counted
    c = choices.leg_choices(recs)
    assert c.chosen == {"decode_cache": 2} and c.basis == {"default": 2}
    (local,) = c.sources
    assert (local.predicted_turns, local.predicted_p50_ms, local.measured_p50_ms, local.ratio_p50) == \
        (0, None, None, None)
    off = choices.leg_choices([_turn("a", 0, 500.0), _turn("a", 1, 800.0)])
    assert off.chosen == {"none": 1} and not off.reported and off.sources == []
    assert choices.leg_choices([]).mix == "-"


def test_the_records_report_and_capacity_json_carry_the_choices(tmp_path: Path) -> None:
    on = _on_leg()
    on.capacity.append(point("on", 2, on.records).to_json())
    off = LegResult("off", [], False, True, records=[replace(r, leg="off", kv_choice=None, kv_choice_basis=None,
                                                             kv_choice_predicted_ms=None, kv_choice_refused=None)
                                                     for r in on.records])
    off.capacity.append(point("off", 2, off.records).to_json())
    result = BenchResult("t", True, {"profile": "agent", "slo": {"ttft_p90": 1000.0}}, [off, on])
    files = report.write(result, tmp_path / "out")
    requests = json.loads(files.requests.read_text())
    warm_on = [r for r in requests if r["leg"] == "on" and r["turn"] >= 1]
    assert sum(1 for r in warm_on if r["kv_choice"]) == 7
    assert all(r["kv_choice"] is None for r in requests if r["leg"] == "off" or r["turn"] == 0)
    assert RequestRecord.from_json(warm_on[0]) == on.records[1]
    legs = {leg["name"]: leg for leg in json.loads(files.legs.read_text())["legs"]}
    assert legs["on"]["kv_choice"]["chosen"] == {"decode_read": 6, "recomputed": 1, "none": 1}
    assert legs["off"]["kv_choice"]["chosen"] == {"none": 8}

    md = files.report.read_text()
    section = md.split("## KV source the router chose")[1].split("\n## ")[0]
    assert "| on | 8 | decode_read 6 (75%), recomputed 1 (12%), none 1 (12%) | model 7 | itl 1 |" in section
    assert "| off | 8 | none 8 (100%) | - | - |" in section
    assert "| on | decode_read | 6 | decode_read 4, prefill_cache 2 | 6 | 50.0 | 115.0 | 2.30 |" in section
    # the capacity section names both mixes: what ran and what the router chose
    assert "| KV sources (what ran) | router chose |" in md
    row = next(line for line in md.splitlines() if line.startswith("| on | - |"))
    assert "decode_read 6, recomputed 1, none 1" in row, row

    doc = json.loads((files.out / capacity_file.CAPACITY_JSON).read_text())
    by_leg = {leg["leg"]: leg for leg in doc["legs"]}
    assert by_leg["on"]["kv_choice"] == choices.of_leg(on).to_json()
    assert by_leg["on"]["kv_sources"] == {"decode_read": 4, "prefill_cache": 2, "recomputed": 2}
    assert by_leg["on"]["points"][0]["kv_choice"] == {"decode_read": 6, "recomputed": 1, "none": 1}
    assert by_leg["off"]["kv_choice"]["chosen"] == {"none": 8} and by_leg["off"]["kv_choice"]["by_source"] == {}


def test_a_bench_whose_router_sent_no_choice_says_so(tmp_path: Path) -> None:
    leg = LegResult("off", [], False, True, records=[_turn("a", 0, 500.0), _turn("a", 1, 800.0)])
    md = report.write(BenchResult("t", True, {}, [leg]), tmp_path / "out").report.read_text()
    assert "No leg's router sent a choice (`X-PD-KV-Choice`)" in md


def test_the_console_and_json_name_the_chosen_mix(tmp_path: Path) -> None:
    from rich.console import Console

    from pdctl.bench.output import render

    on = _on_leg()
    result = BenchResult("t", True, {}, [on])
    files = report.write(result, tmp_path / "out")
    console = Console(record=True, width=200, color_system=None)
    render.print_outcome(result, files, console)
    text = console.export_text()
    assert "leg on: the router chose decode_read 6 (75%), recomputed 1 (12%), none 1 (12%)" in text, text
    assert render.as_json(result, files)["legs"][0]["kv_choice"]["chosen"] == {"decode_read": 6, "recomputed": 1,
                                                                               "none": 1}
