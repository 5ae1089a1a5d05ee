"""A bench's output directory: per-request JSON, legs JSON, summary CSV, three PNG plots and report.md."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdctl.bench.output import capacity_file, plots
from pdctl.bench.results import choices, stages
from pdctl.bench.results.paths import leg_path
from pdctl.bench.results.paths import paths as leg_paths
from pdctl.bench.results.records import BenchResult, LegResult
from pdctl.bench.results.stats import SummaryRow, percentile, ratios, reuse_counts, summarize
from pdctl.bench.runner import capacity
from pdctl.router.wire import PREFILL_CACHE

REQUESTS_JSON = "requests.json"
LEGS_JSON = "legs.json"
SUMMARY_CSV = "summary.csv"
REPORT_MD = "report.md"


@dataclass(frozen=True)
class ReportFiles:
    out: Path
    requests: Path
    legs: Path
    summary: Path
    ttft_png: Path
    prefill_png: Path
    report: Path
    stages_png: Path


def write(result: BenchResult, out: Path) -> ReportFiles:
    out.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(
        out,
        out / REQUESTS_JSON,
        out / LEGS_JSON,
        out / SUMMARY_CSV,
        out / plots.TTFT_PNG,
        out / plots.PREFILL_PNG,
        out / REPORT_MD,
        out / plots.STAGES_PNG,
    )
    rows = summarize(result.legs)
    files.requests.write_text(json.dumps([r.to_json() for r in result.records], indent=1) + "\n")
    meta = {
        "topology": result.topology,
        "simulated": result.simulated,
        "started_at": result.started_at,
        "wall_s": round(result.wall_s, 2),
        "passed": result.passed,
        "interrupted": result.interrupted,
        "workload": result.workload,
        "host": result.host,
        **({"eviction": result.eviction} if result.eviction is not None else {}),
        "legs": [leg.to_json() | {"kv_choice": choices.of_leg(leg).to_json()} for leg in result.legs],
    }
    files.legs.write_text(json.dumps(meta, indent=1, default=str) + "\n")
    _write_csv(rows, files.summary)
    splits = plots.prefill_splits(result, rows)
    plots.plot_ttft(result, rows, files.ttft_png)
    plots.plot_prefill(result, splits, files.prefill_png)
    stage_rows = stages.stage_rows(result.legs)
    plots.plot_stages(result, stage_rows, files.stages_png)
    text = markdown(result, rows, splits, stage_rows)
    points, slo = capacity_points(result)
    if points:
        plots.plot_goodput(points, slo, f"Agent sessions within the SLO — {plots.label(result)}",
                           out / plots.GOODPUT_PNG)
        doc = capacity_file.document(result, points, slo)
        (out / capacity_file.CAPACITY_JSON).write_text(json.dumps(doc, indent=1, default=str) + "\n")
        text = _with_capacity(text, points, slo, result, doc)
    files.report.write_text(text)
    return files


def capacity_points(result: BenchResult) -> tuple[list[capacity.Point], capacity.Slo]:
    raw = result.workload.get("slo")
    slo = capacity.Slo(**raw) if isinstance(raw, dict) else capacity.Slo()
    points = [capacity.Point(**p) for leg in result.legs for p in leg.capacity]
    return points, slo


def _with_capacity(text: str, points: list[capacity.Point], slo: capacity.Slo, result: BenchResult,
                   doc: dict[str, Any]) -> str:
    """The capacity section goes first: in a capacity run the per-length tables below are per session count."""
    head, _, rest = text.partition("\n\n")
    agent = result.workload.get("agent") or {}
    lines = [head, "", "## Capacity: agent sessions per leg" + (" (simulated)" if result.simulated else ""), "",
             f"Workload: {', '.join(f'{k}={v}' for k, v in agent.items())}. TTFT over warm turns (turn >= 2); the "
             "inter-token figure is the p99 over requests of each request's largest gap between two chunks. "
             "In the tables further down, each row is one point (its number of sessions)"
             + (" and times are wall clock; in this table they are modelled (wall x sim.speed)." if result.simulated
                else "."), ""]
    lines += capacity.table(points, slo)
    lines += ["", *_capacity_notes(doc), "", f"![Goodput: sessions vs TTFT and inter-token gap]({plots.GOODPUT_PNG})",
              ""]
    return "\n".join(lines) + "\n" + rest


def _capacity_notes(doc: dict[str, Any]) -> list[str]:
    """Each leg's path and KV-source mix, the ratios, the eviction sizing, the machine's load and the warnings."""
    lines = ["Legs by where their warm turns' KV came from (what ran: router `X-PD-KV-Reuse`) and by the source the "
             "router chose for them (`X-PD-KV-Choice`; none: it sent no choice), every point and run:", "",
             "| leg | shape | path measured | warm turns | KV sources (what ran) | router chose "
             "| sessions within SLO |",
             "|---|---|---|---|---|---|---|"]
    for leg in doc["legs"]:
        mix = ", ".join(f"{k} {v}" for k, v in leg["kv_sources"].items()) or "-"
        chose = ", ".join(f"{k} {v}" for k, v in leg["kv_choice"]["chosen"].items()) or "-"
        lines.append(f"| {leg['leg']} | {leg['shape'] or '-'} | {leg['path']} | {leg['warm_turns']} | {mix} | "
                     f"{chose} | {leg['sessions_within_slo']} |")
    shown = ", ".join(f"{k} {'-' if v is None else f'{v:.2f}x'}" for k, v in doc["ratios"].items())
    if shown:
        lines += ["", f"Sessions within the SLO, ratios: {shown}."]
    if doc.get("eviction"):
        e = doc["eviction"]
        kv = " + ".join(f"{t:,}" for t in e["prefill_kv_tokens"]) or "unknown"
        lines += ["", f"Eviction profile: prefill KV {kv} tokens; a session's history at its last turn "
                  f"{e['shared_tokens']:,} shared + {e['session_tokens']:,} of its own tokens; the histories exceed "
                  f"the prefills' KV from {e['evict_from'] or 'an unknown number of'} sessions."]
    host = doc["host"]
    loads = [f"{k.removeprefix('load_average_').replace('_', ' ')} {v if not isinstance(v, list) else v[0]}"
             for k, v in host.items() if k.startswith("load_average") and v is not None]
    lines += ["", f"Machine: {host.get('cpus', '?')} cores; 1-minute load average {', '.join(loads)}. "
              f"Each point is played {doc['workload'].get('runs', 1)} time(s), a third when two differ by more than "
              f"{capacity.TOLERANCE:.0%} in an SLO figure; the table pools the two that agree best. Full figures: "
              f"`{capacity_file.CAPACITY_JSON}`."]
    lines += [f"\n**Warning**: {w}." for w in doc["warnings"]]
    return lines


def _write_csv(rows: list[SummaryRow], path: Path) -> None:
    data = [r.csv_row() for r in rows]
    with path.open("w", newline="") as f:
        if not data:
            f.write("leg,length,scope,requests\n")
            return
        writer = csv.DictWriter(f, fieldnames=list(data[0]))
        writer.writeheader()
        writer.writerows(data)


def markdown(result: BenchResult, rows: list[SummaryRow], splits: list[plots.PrefillSplit],
             stage_rows: list[stages.StageRow] | None = None) -> str:
    names = [leg.name for leg in result.legs]
    lengths = sorted({r.length for r in rows})
    ratio = ratios(rows, names)
    x = plots.axis(result)
    verdict = "INTERRUPTED (Ctrl-C): partial results" if result.interrupted else \
        "PASSED" if result.passed else "FAILED"
    lines = [
        f"# pdctl bench: {result.topology} — {plots.label(result)}",
        "",
        f"{verdict}. Started {result.started_at}, {result.wall_s:.0f} s. "
        + ("**Simulated engines**: timings come from pdctl.sim, not from GPUs." if result.simulated else ""),
        "",
        "Workload: " + ", ".join(f"{k} {v}" for k, v in result.workload.items()),
        "",
        "## Legs",
        "",
        "| leg | overrides | bidirectional | requests | result | path measured (warm turns) |",
        "|---|---|---|---|---|---|",
    ]
    measured = {p.leg: p for p in leg_paths(result.legs)}
    for leg in result.legs:
        state = "pass" if leg.passed else "**FAIL**: " + "; ".join(leg.failures)
        lines.append(
            f"| {leg.name} | {', '.join(leg.overrides) or '(as deployed)'} | {_onoff(leg)} | "
            f"{len(leg.records)} | {state} | {measured[leg.name].label.removeprefix(leg.name + ': ')} |"
        )
    flags = [p.flag for p in measured.values() if p.flag]
    if flags:
        lines += [""] + [f"**Flag**: {f}." for f in flags]
    lines += ["", "## TTFT of turns 2+ (ms): mean / median / p90", ""]
    head = f"| {x} | " + " | ".join(names) + " | " + " | ".join(f"{names[0]}/{n}" for n in names[1:])
    lines += [head.rstrip(" |") + " |", "|---" * (len(names) * 2) + "|"]
    for n in lengths:
        cells = [_triple(rows, leg, n, "ttft_ms") for leg in names]
        cells += [_fmt(ratio[leg][n], 2) for leg in names[1:]]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "## TTFT of turn 1 (cold on every leg, ms): mean", ""]
    lines += [f"| {x} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for n in lengths:
        cells = [_fmt(_mean(rows, leg, n, "ttft_ms", "first")) for leg in names]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += _reuse_section(result.legs)
    lines += _choice_section(result.legs)
    lines += _prefill_section(splits, names, lengths, result.legs, x)
    lines += _after_prefill_section(result.legs, names, lengths, x)
    lines += stages.markdown(stage_rows if stage_rows is not None else stages.stage_rows(result.legs), x)
    lines += _streaming_section(result.legs)
    lines += [
        "",
        "## Plots",
        "",
        f"![TTFT vs {'sessions' if x == 'sessions' else 'prompt length'}]({plots.TTFT_PNG})",
        "",
        f"![Prefill duration per {x}]({plots.PREFILL_PNG})",
        "",
        f"![Where warm-turn TTFT goes]({plots.STAGES_PNG})",
        "",
        f"Per-request records: `{REQUESTS_JSON}`; summary by leg, length and scope: `{SUMMARY_CSV}`; "
        f"legs, KV transfer and router stats: `{LEGS_JSON}`.",
        "",
    ]
    return "\n".join(lines)


def _reuse_section(legs: list[LegResult]) -> list[str]:
    lines = ["", "## KV reuse (router `X-PD-KV-Reuse`, turns 2+) and prefill-side KV transfer", ""]
    lines += ["| leg | warm turns | hit | partial | miss | hit rate | on the decode alone | from the prefill's cache "
              "| transfers | GiB | transfers / warm turn | GiB / warm turn | avg transfer ms | source |"]
    lines += ["|---" * 14 + "|"]
    for leg in legs:
        c = reuse_counts(leg.records)
        kv, p = leg.kv, leg_path(leg)
        lines.append(
            f"| {leg.name} | {c.eligible} | {c.hit} | {c.partial} | {c.miss} | {_pct(c.rate)} | {c.local} | "
            f"{_pct(p.shares.get(PREFILL_CACHE, math.nan))} | {kv.transfers} | "
            f"{kv.bytes / 2**30:.2f} | {p.transfers_per_turn:.2f} | {_fmt(p.gib_per_turn, 3)} | {kv.avg_xfer_ms:.1f} | "
            f"{kv.source} |"
        )
    return lines


def _choice_section(legs: list[LegResult]) -> list[str]:
    """What the router chose for each warm turn against what the turn did, and predicted against measured TTFT."""
    lines = ["", "## KV source the router chose (router `X-PD-KV-Choice`, turns 2+) against what ran", ""]
    by_leg = {leg.name: choices.of_leg(leg) for leg in legs}
    if not any(c.reported for c in by_leg.values()):
        return [*lines, "No leg's router sent a choice (`X-PD-KV-Choice`): OFF and aggregated legs, or a router "
                "without the cost model."]
    lines += ["The choice is the router's cost model's (basis `model`), the rule before it (`default`, its rates "
              "not yet measured) or a probe (`probe`: a local turn that measures the decode's costs, "
              "router.local_stall_ratio 0); `none`: no choice sent (no history on a decode to reuse: an OFF leg, a "
              "released handle). What ran is the path above "
              "(`X-PD-KV-Reuse`): a read can still find the history in the prefill's own cache.", "",
              "| leg | warm turns | router chose | basis | decode alone refused |", "|---" * 5 + "|"]
    for name, c in by_leg.items():
        basis = ", ".join(f"{k} {v}" for k, v in c.basis.items()) or "-"
        refused = ", ".join(f"{k} {v}" for k, v in c.refused.items()) or "-"
        lines.append(f"| {name} | {c.warm_turns} | {c.mix} | {basis} | {refused} |")
    lines += ["", "Predicted against measured TTFT of the turns the model chose (wall-clock ms, p50 of each; "
              "measured / predicted: p50 of the per-turn ratio, > 1 where the model was optimistic; measured by this "
              "client, so it also holds the router's own time):", "",
              "| leg | chosen | turns | what ran | predicted turns | predicted p50 | measured p50 | measured / "
              "predicted |", "|---" * 8 + "|"]
    for name, c in by_leg.items():
        for s in c.sources:
            ran = ", ".join(f"{k} {v}" for k, v in s.ran.items()) or "-"
            lines.append(f"| {name} | {s.source} | {s.turns} | {ran} | {s.predicted_turns} | "
                         f"{_opt(s.predicted_p50_ms)} | {_opt(s.measured_p50_ms)} | {_opt(s.ratio_p50, 2)} |")
    return lines


def _opt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _prefill_section(
    splits: list[plots.PrefillSplit], names: list[str], lengths: list[int], legs: list[LegResult], x: str = "length"
) -> list[str]:
    lines = ["", "## Prefill duration of turns 2+ (ms, router `X-PD-Prefill-Ms`): total (KV transfer + compute)", ""]
    lines += [f"| {x} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    bidir = {leg.name: leg.bidirectional for leg in legs}
    for n in lengths:
        cells = []
        for name in names:
            s = next((x for x in splits if x.leg == name and x.length == n), None)
            if s is None or math.isnan(s.total_ms):
                cells.append("-")
            elif bidir[name]:
                cells.append(f"{s.total_ms:.1f} ({s.kv_ms:.1f} + {s.compute_ms:.1f})")
            else:
                cells.append(f"{s.total_ms:.1f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def _after_prefill_section(legs: list[LegResult], names: list[str], lengths: list[int],
                           x: str = "length") -> list[str]:
    """TTFT minus the prefill hop: the decode admitting the request, pulling the blocks it lacks, its first step."""
    lines = ["", "## After the prefill: TTFT minus prefill of turns 2+ (ms, mean): the decode's part", ""]
    lines += [f"| {x} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    by_leg = {leg.name: leg for leg in legs}
    for n in lengths:
        cells = []
        for name in names:
            gaps = [r.ttft_ms - r.prefill_ms for r in by_leg[name].records
                    if r.length == n and r.turn >= 1 and r.ok and r.ttft_ms is not None and r.prefill_ms is not None]
            cells.append(_fmt(sum(gaps) / len(gaps)) if gaps else "-")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def _streaming_section(legs: list[LegResult]) -> list[str]:
    """Decode smoothness per leg over every request: TPOT, and the largest gap between streamed chunks, which shows
    a stall (a prefill in the decode's batch, e.g. a local turn of another conversation) that TPOT averages away."""
    lines = ["", "## Streaming, all turns (ms): TPOT mean / p90, largest inter-token gap per request p50 / p90 / max",
             ""]
    lines += ["| leg | requests | TPOT mean | TPOT p90 | gap p50 | gap p90 | gap max |", "|---" * 7 + "|"]
    for leg in legs:
        tpot = [r.tpot_ms for r in leg.records if r.ok and r.tpot_ms is not None]
        gaps = [r.itl_max_ms for r in leg.records if r.ok and r.itl_max_ms is not None]
        cells = [_fmt(sum(tpot) / len(tpot)) if tpot else "-", _fmt(percentile(tpot, 90)) if tpot else "-"]
        cells += [_fmt(percentile(gaps, q)) if gaps else "-" for q in (50, 90)]
        cells.append(_fmt(max(gaps)) if gaps else "-")
        lines.append(f"| {leg.name} | {len(leg.records)} | " + " | ".join(cells) + " |")
    return lines


def _mean(rows: list[SummaryRow], leg: str, n: int, metric: str, scope: str) -> float:
    for r in rows:
        if r.leg == leg and r.length == n and r.scope == scope:
            return r.mean(metric)
    return math.nan


def _triple(rows: list[SummaryRow], leg: str, n: int, metric: str) -> str:
    for r in rows:
        if r.leg == leg and r.length == n and r.scope == "warm":
            return " / ".join(_fmt(v) for v in r.values[metric])
    return "-"


def _onoff(leg: LegResult) -> str:
    if leg.mode == "aggregated":
        return "aggregated (one engine)" if leg.engines == 1 else f"aggregated ({leg.engines} engines)"
    return "on" if leg.bidirectional else "off"


def _fmt(x: float, digits: int = 1) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.0%}"
