"""`capacity.json`: what a capacity run (`--sweep`/`--slo`, the agent and eviction profiles) measured, per leg: the
largest number of sessions within the SLO, the leg's path and KV-source mix over its warm turns (what ran: the
router's per-turn `X-PD-KV-Reuse`), the mix of sources the router chose for them (`kv_choice`: its per-turn
`X-PD-KV-Choice`, with predicted against measured TTFT per source, pdctl.bench.results.choices), every point with
its runs and both mixes; the ratios of the legs to the first (the baseline) and to the
aggregated leg; the machine's load average, and warnings where the numbers cannot be trusted.

A warning is written when this machine's 1-minute load average reached `LOAD_HIGH` of its cores at the start, the
end or any point (other work competes with the engines and the player), when an engine used `CPU_NEAR_ONE` of a core
or more over a point (a simulator that busy runs behind its model: lower its --speed), and when a point's kept runs
did not agree within the tolerance.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pdctl.bench.results import choices
from pdctl.bench.results.paths import leg_path
from pdctl.bench.results.records import BenchResult, LegResult
from pdctl.bench.runner.capacity import TOLERANCE, Point, Slo, largest_within

CAPACITY_JSON = "capacity.json"
LOAD_HIGH = 0.75  # of the machine's cores
CPU_NEAR_ONE = 0.8  # of one core, per engine process
UNREPORTED = "unreported"  # a warm turn without the router's header (an aggregated engine alone)


def _of_point(leg: LegResult, sessions: int) -> dict[str, int]:
    """Warm turns per source the router chose, of that point only."""
    return choices.leg_choices([r for r in leg.records if r.length == sessions]).chosen


def kv_sources(leg: LegResult, sessions: int | None = None) -> dict[str, int]:
    """Warm turns (turn >= 1, answered) per KV source, from the router's per-turn header; `sessions`: of that point
    only (a capacity record's `length` is its point's session count)."""
    counts = Counter(r.source or UNREPORTED for r in leg.records
                     if r.turn >= 1 and r.ok and (sessions is None or r.length == sessions))
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def document(result: BenchResult, points: Sequence[Point], slo: Slo) -> dict[str, Any]:
    legs = []
    best: dict[str, int] = {}
    for leg in result.legs:
        mine = [p for p in points if p.leg == leg.name]
        if not mine and not leg.capacity:
            continue
        path = leg_path(leg)
        best[leg.name] = largest_within(mine, slo)
        legs.append({
            "leg": leg.name, "shape": leg.shape, "mode": leg.mode, "bidirectional": leg.bidirectional,
            "overrides": leg.overrides, "path": path.path, "label": path.label,
            "sessions_within_slo": best[leg.name], "warm_turns": path.warm_turns, "kv_sources": kv_sources(leg),
            "kv_choice": choices.of_leg(leg).to_json(),
            "points": [p.to_json() | {"kv_sources": kv_sources(leg, p.sessions),
                                      "kv_choice": _of_point(leg, p.sessions)} for p in mine],
        })
    return {
        "topology": result.topology,
        "simulated": result.simulated,
        "started_at": result.started_at,
        "slo": {k: v for k, v in slo.__dict__.items() if math.isfinite(v)},
        "workload": result.workload,
        "eviction": result.eviction,
        "host": {**result.host, "load_average_points_max": _max_load(points)},
        "legs": legs,
        "ratios": ratios(result.legs, best),
        "warnings": warnings(result, points),
    }


def ratios(legs: Sequence[LegResult], best: dict[str, int]) -> dict[str, float | None]:
    """Each leg's sessions within the SLO over the first leg's (the baseline) and over the aggregated leg's (None
    where the divisor holds no session)."""
    names = [leg.name for leg in legs if leg.name in best]
    if not names:
        return {}
    divisors = [names[0]] + [leg.name for leg in legs if leg.mode == "aggregated" and leg.name in best]
    out: dict[str, float | None] = {}
    for d in dict.fromkeys(divisors):
        for n in names:
            if n != d:
                out[f"{n}/{d}"] = round(best[n] / best[d], 2) if best[d] else None
    return out


def warnings(result: BenchResult, points: Sequence[Point]) -> list[str]:
    out = []
    cpus = int(result.host.get("cpus") or 0)
    loads = [float(x[0]) for x in (result.host.get("load_average_start"), result.host.get("load_average_end")) if x]
    loads += [p.load for p in points if p.load is not None]
    if cpus and loads and max(loads) >= LOAD_HIGH * cpus:
        out.append(f"load average reached {max(loads):.2f} on {cpus} cores (>= {LOAD_HIGH:.0%} of them): other work "
                   "competed with the engines and the player; run the sweep alone on the machine")
    hot = sorted({(p.leg, p.sessions, e.engine, e.cpu) for p in points for e in p.engines
                  if e.cpu is not None and e.cpu >= CPU_NEAR_ONE}, key=lambda x: -(x[3] or 0.0))
    if hot:
        leg, n, engine, cpu = hot[0]
        more = f" and {len(hot) - 1} more" if len(hot) > 1 else ""
        out.append(f"engine CPU near one core: {engine} of leg {leg} at {n} sessions used {cpu:.2f} cores{more}; "
                   "a simulator that busy runs behind its model (lower sim.speed)")
    split = [f"{p.leg} x{p.sessions}" for p in points if p.agreed is False]
    if split:
        out.append(f"runs did not agree within {TOLERANCE:.0%} even after a third run: {', '.join(split)}")
    return out


def _max_load(points: Sequence[Point]) -> float | None:
    loads = [p.load for p in points if p.load is not None]
    return max(loads) if loads else None
