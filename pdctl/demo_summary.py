"""The demo's account of each case, per leg and point (a prompt length in the first case, a number of agent
sessions in the second): the warm turns' TTFT p50 and p90, where each warm turn's history KV came from (counts),
and what the prefills read back from the decodes per warm turn. Written as `summary.json` beside the case's report
and printed as rich tables with the ratio of each leg to the first (OFF).

Where a warm turn's history came from is the bench's account, as the report's path labels have it
(`pdctl.bench.results.paths.warm_sources`: the router's X-PD-KV-Reuse, with a turn served from a prefill's cache
that held under 90 % of its history counted as a recompute). D->P transfers and GiB per warm turn come from one
meter, the prefills' NIXL counters over the point (`pdctl.bench.runner.probe.KvMeter`); tokens read per warm turn
from the prefills' own reports (`read=`).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pdctl.bench.results.paths import leg_path, warm_sources
from pdctl.bench.results.records import BenchResult, KvTransfer, LegResult, RequestRecord
from pdctl.bench.results.stats import percentile
from pdctl.bench.runner import capacity
from pdctl.router.wire import DECODE_CACHE, DECODE_READ, PREFILL_CACHE, PREFILL_WHOLE, RECOMPUTED

SUMMARY_JSON = "summary.json"
SOURCES = {DECODE_CACHE: "local", DECODE_READ: "D->P read", PREFILL_CACHE: "prefill cache",
           PREFILL_WHOLE: "whole on prefill", RECOMPUTED: "recompute"}
"""local: the decode alone, from its own cache; D->P read: a prefill read it back from the decode; prefill cache:
the prefill's own prefix cache held it; recompute: the prefill computed it (most of it) again."""


@dataclass(frozen=True)
class CasePoint:
    """One leg at one point: `x` is the point's prompt length (axis "length") or number of sessions."""

    leg: str
    x: int
    sessions: int
    warm_turns: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    itl_p99_ms: float
    within_slo: bool | None
    transfers_per_turn: float
    gib_per_turn: float
    tokens_read_per_turn: float
    path_mix: dict[str, int]

    def to_json(self, axis: str) -> dict[str, Any]:
        out: dict[str, Any] = {"sessions": self.sessions}
        if axis != "sessions":
            out[axis] = self.x
        out |= {
            "warm_turns": self.warm_turns,
            "ttft_p50_ms": _num(self.ttft_p50_ms),
            "ttft_p90_ms": _num(self.ttft_p90_ms),
        }
        if self.within_slo is not None:
            out |= {"itl_p99_ms": _num(self.itl_p99_ms), "within_slo": self.within_slo}
        out["kv_read_back_per_warm_turn"] = {
            "transfers": _num(self.transfers_per_turn, 3),
            "gib": _num(self.gib_per_turn, 4),
            "tokens": _num(self.tokens_read_per_turn, 1),
        }
        out["path_mix"] = self.path_mix
        return out


@dataclass(frozen=True)
class CaseSummary:
    case: str
    axis: str  # "length" or "sessions"
    time: str  # what the TTFT figures measure: wall time, or modelled time (wall x sim.speed)
    simulated: bool
    legs: list[LegResult]
    points: list[CasePoint]
    slo: capacity.Slo | None = None

    def ratios(self) -> dict[str, dict[int, float]]:
        """Each later leg's warm TTFT p90 over the first leg's (OFF), per point: below 1, faster than OFF."""
        names = [leg.name for leg in self.legs]
        if len(names) < 2:
            return {}
        by = {(p.leg, p.x): p for p in self.points}
        out: dict[str, dict[int, float]] = {}
        for name in names[1:]:
            out[f"{name}/{names[0]}"] = {
                x: _ratio(by[(name, x)].ttft_p90_ms, by[(names[0], x)].ttft_p90_ms)
                for x in self.xs() if (name, x) in by and (names[0], x) in by
            }
        return out

    def xs(self) -> list[int]:
        return sorted({p.x for p in self.points})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"case": self.case, "simulated": self.simulated, "axis": self.axis, "time": self.time}
        if self.slo is not None:
            out["slo"] = self.slo.describe()
        out["legs"] = [
            {"leg": leg.name, "path": leg_path(leg).path, "bidirectional": leg.bidirectional,
             "overrides": leg.overrides, "passed": leg.passed,
             "points": [p.to_json(self.axis) for p in self.points if p.leg == leg.name]}
            for leg in self.legs
        ]
        out["ttft_p90_ratios"] = {k: {str(x): _num(v, 3) for x, v in r.items()} for k, r in self.ratios().items()}
        out["notes"] = (
            "path_mix counts warm turns (turn >= 2) by where their history KV came from; kv_read_back_per_warm_turn: "
            "transfers and gib from the prefills' NIXL counters (D->P reads), tokens from the prefills' read= reports")
        return out


def sweep_summary(result: BenchResult, case: str) -> CaseSummary:
    """The single-client case: one point per leg and prompt length; TTFT in wall time, one session at a time."""
    points = []
    for leg in result.legs:
        for length in sorted({r.length for r in leg.records}):
            recs = [r for r in leg.records if r.length == length]
            warm = _warm(recs)
            ttft = [r.ttft_ms for r in warm if r.ttft_ms is not None]
            points.append(_point(leg, length, 1, recs, percentile(ttft, 50), percentile(ttft, 90), math.nan, None))
    return CaseSummary(case, "length", "wall ms", result.simulated, result.legs, points)


def capacity_summary(result: BenchResult, case: str) -> CaseSummary:
    """The eviction case: one point per leg and number of sessions, TTFT and ITL as its capacity point has them
    (modelled time on the simulator), within the run's SLO or not."""
    from pdctl.bench.output.report import capacity_points

    cap, slo = capacity_points(result)
    by_leg = {leg.name: leg for leg in result.legs}
    points = []
    for p in cap:
        leg = by_leg[p.leg]
        recs = [r for r in leg.records if r.length == p.sessions]
        points.append(_point(leg, p.sessions, p.sessions, recs, p.ttft_p50, p.ttft_p90, p.itl_p99, p.within(slo)))
    time = "modelled ms (wall x sim.speed)" if result.simulated else "wall ms"
    return CaseSummary(case, "sessions", time, result.simulated, result.legs, points, slo)


def write(summary: CaseSummary, out: Path) -> Path:
    path = out / SUMMARY_JSON
    path.write_text(json.dumps(summary.to_json(), indent=1) + "\n")
    return path


def tables(summary: CaseSummary, title: str) -> list[Table]:
    """Two tables over every point of every leg, grouped by point: the warm turns' TTFT (and the SLO), then where
    their history KV came from and what the prefills read back, as `summary.json` has them."""
    ttft = Table(title=title, title_justify="left")
    kv = Table(title="Where the warm turns' history KV came from, and the KV the prefills read back from the "
               "decodes per warm turn (D->P)", title_justify="left")
    for t in (ttft, kv):
        t.add_column(summary.axis, justify="right")
        t.add_column("leg")
    ttft.add_column("warm turns", justify="right")
    ttft.add_column("TTFT p50", justify="right")
    ttft.add_column("TTFT p90", justify="right")
    if summary.slo is not None:
        ttft.add_column("within SLO")
    kv.add_column("path mix (warm turns)")
    kv.add_column("transfers", justify="right")
    kv.add_column("tokens", justify="right")
    kv.add_column("GiB", justify="right")
    by = {(p.leg, p.x): p for p in summary.points}
    for x in summary.xs():
        mine = [(leg, by[(leg.name, x)]) for leg in summary.legs if (leg.name, x) in by]
        for i, (leg, p) in enumerate(mine):
            last = i == len(mine) - 1
            cells = [str(x), leg.name, str(p.warm_turns), _ms(p.ttft_p50_ms), _ms(p.ttft_p90_ms)]
            if summary.slo is not None:
                cells.append("yes" if p.within_slo else "no")
            ttft.add_row(*cells, end_section=last)
            kv.add_row(str(x), leg.name, mix_text(p.path_mix), _f(p.transfers_per_turn, 2),
                       _f(p.tokens_read_per_turn, 0), _f(p.gib_per_turn, 3), end_section=last)
    return [ttft, kv]


def ratio_lines(summary: CaseSummary) -> list[str]:
    """`on/off warm TTFT p90: 4 sessions 0.95x, 16 sessions 0.08x (12.5x faster)`."""
    unit = "sessions" if summary.axis == "sessions" else "tokens"
    lines = []
    for name, by_x in summary.ratios().items():
        parts = [f"{x} {unit} {r:.2f}x" + (f" ({1 / r:.1f}x faster)" if 0 < r < 0.8 else "")
                 for x, r in by_x.items() if math.isfinite(r)]
        if parts:
            lines.append(f"{name} warm TTFT p90: " + ", ".join(parts))
    return lines


def source_lines(summary: CaseSummary) -> list[str]:
    """Where the win comes from, at the largest point: each leg's warm turns by where their history was."""
    if not summary.points:
        return []
    x = summary.xs()[-1]
    unit = "sessions" if summary.axis == "sessions" else "tokens"
    lines = []
    for p in (p for p in summary.points if p.x == x):
        mix, n = p.path_mix, p.warm_turns
        decode = mix.get(SOURCES[DECODE_CACHE], 0) + mix.get(SOURCES[DECODE_READ], 0)
        lines.append(f"at {x} {unit}, {p.leg}: history from the decode's KV in {decode}/{n} warm turns "
                     f"({SOURCES[DECODE_CACHE]} {mix.get(SOURCES[DECODE_CACHE], 0)}, {SOURCES[DECODE_READ]} "
                     f"{mix.get(SOURCES[DECODE_READ], 0)}), from the prefill's cache in "
                     f"{mix.get(SOURCES[PREFILL_CACHE], 0)}/{n}, recomputed in {mix.get(SOURCES[RECOMPUTED], 0)}/{n}")
    return lines


def print_case(summary: CaseSummary, title: str, console: Console) -> None:
    for t in tables(summary, title):
        console.print(t)
    for line in source_lines(summary) + ratio_lines(summary):
        console.print(line, highlight=False)


def mix_text(mix: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1])) or "-"


def turn_sources(records: Sequence[RequestRecord]) -> Counter[str]:
    """Each successful warm turn's history source (`pdctl.bench.results.paths.warm_sources`), counted."""
    return Counter(SOURCES.get(source, source) for _, source in warm_sources(records))


def _point(leg: LegResult, x: int, sessions: int, recs: list[RequestRecord], p50: float, p90: float, itl: float,
           within: bool | None) -> CasePoint:
    warm = _warm(recs)
    n = max(len(warm), 1)
    kv = leg.kv_by_length.get(x, KvTransfer())
    metered = kv.source != "none"  # no meter over this point: neither figure, rather than a 0 beside the leg's
    transfers = kv.transfers / n if metered else math.nan
    gib = kv.bytes / 2**30 / n if metered else math.nan
    tokens = sum(r.reuse_read or 0 for r in warm) / n
    return CasePoint(leg.name, x, sessions, len(warm), p50, p90, itl, within, transfers, gib, tokens,
                     dict(turn_sources(recs)))


def _warm(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.turn >= 1 and r.ok]


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def _num(x: float, digits: int = 1) -> float | None:
    return round(x, digits) if math.isfinite(x) else None


def _ms(x: float) -> str:
    return f"{x:.0f}" if math.isfinite(x) else "-"


def _f(x: float, digits: int) -> str:
    return f"{x:.{digits}f}" if math.isfinite(x) else "not metered"
