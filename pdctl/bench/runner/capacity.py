"""Capacity at an SLO: play N agent sessions per point, a sweep over N or a search for the largest N within the SLO.

A point's TTFT is over its warm turns (turn >= 1); its inter-token figure is the p99 over requests of each
request's largest gap between two streamed chunks (stricter than the p99 of all gaps: a stall counts whole).
A point with any failed request is outside every SLO. On the simulator the points are in modelled time: wall
time times sim.speed (the records themselves keep wall time, as every bench record does).

With a meter (pdctl.bench.runner.collect.UsageMeter) each point also records each engine's busy fraction (modelled step
time over the point's modelled duration), prefill and decode tokens, and KV high-water mark; the table shows the
busy % and KV peak % per engine, "-" where an engine has no such counters (a real vLLM), and no columns at all
when no point has any.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

from pdctl.bench.results.records import RequestRecord
from pdctl.bench.results.stats import percentile
from pdctl.bench.runner.collect import EngineUsage
from pdctl.bench.traffic.agent import AgentSpec
from pdctl.errors import UsageError

SLO_KEYS = ("ttft_p50", "ttft_p90", "itl_p99")
SEARCH_LIMIT = 256


@dataclass(frozen=True)
class Slo:
    ttft_p50: float = math.inf
    ttft_p90: float = math.inf
    itl_p99: float = math.inf

    @classmethod
    def parse(cls, text: str) -> Slo:
        """`ttft_p90=500,itl_p99=200` (milliseconds)."""
        values: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            key, sep, value = part.partition("=")
            if not sep or key not in SLO_KEYS:
                raise UsageError(f"--slo {part!r} is not KEY=MS with KEY one of {', '.join(SLO_KEYS)}",
                                 hint="e.g. --slo ttft_p90=500,itl_p99=200")
            try:
                values[key] = float(value)
            except ValueError:
                raise UsageError(f"--slo {key}={value!r} is not a number of milliseconds",
                                 hint="e.g. --slo ttft_p90=500") from None
        if not values:
            raise UsageError("--slo is empty", hint="e.g. --slo ttft_p90=500,itl_p99=200")
        return cls(**values)

    def describe(self) -> str:
        return ", ".join(f"{k} <= {getattr(self, k):g} ms" for k in SLO_KEYS if math.isfinite(getattr(self, k)))


def parse_sweep(text: str) -> tuple[int, ...]:
    """`sessions=1,2,4,8`."""
    key, sep, values = text.partition("=")
    if key.strip() != "sessions" or not sep:
        raise UsageError(f"--sweep {text!r} is not sessions=N,N,...", hint="e.g. --sweep sessions=1,2,4,8,16")
    try:
        ns = tuple(sorted({int(v) for v in values.split(",") if v.strip()}))
    except ValueError:
        raise UsageError(f"--sweep {text!r}: session counts must be integers", hint="e.g. --sweep sessions=1,2,4") \
            from None
    if not ns or ns[0] < 1:
        raise UsageError(f"--sweep {text!r}: session counts must be >= 1", hint="e.g. --sweep sessions=1,2,4")
    return ns


@dataclass(frozen=True)
class CapacityOptions:
    """A capacity run: the agent sessions of each point, and the sweep's session counts or the SLO to search."""

    agent: AgentSpec
    sessions: tuple[int, ...] = ()  # a sweep; empty: search for the largest N within the SLO
    slo: Slo = Slo()
    limit: int = SEARCH_LIMIT

    def __post_init__(self) -> None:
        if not self.sessions and self.slo == Slo():
            raise UsageError("a capacity run needs --sweep sessions=... or --slo KEY=MS to search",
                             hint="e.g. --sweep sessions=1,2,4,8 or --slo ttft_p90=500,itl_p99=200")


@dataclass(frozen=True)
class Point:
    leg: str
    sessions: int
    requests: int
    failed: int
    ttft_p50: float
    ttft_p90: float
    itl_p99: float
    itl_max: float
    engines: tuple[EngineUsage, ...] = ()

    def __post_init__(self) -> None:
        # Points read back from legs.json as Point(**p) (scripts do) carry their engines as dicts.
        engines = tuple(e if isinstance(e, EngineUsage) else EngineUsage.from_json(e) for e in self.engines)
        object.__setattr__(self, "engines", engines)

    def within(self, slo: Slo) -> bool:
        return (self.failed == 0 and self.ttft_p50 <= slo.ttft_p50 and self.ttft_p90 <= slo.ttft_p90
                and self.itl_p99 <= slo.itl_p99)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: _rounded(getattr(self, f.name)) for f in fields(self) if f.name != "engines"}
        if self.engines:
            out["engines"] = [e.to_json() for e in self.engines]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Point:
        return cls(**data)


class Meter(Protocol):
    """Reads each engine over one point: start() before its sessions, stop(modelled ms) after them."""

    def start(self) -> None: ...

    def stop(self, span_ms: float) -> tuple[EngineUsage, ...]: ...


def point(leg: str, sessions: int, records: Sequence[RequestRecord], time_scale: float = 1.0,
          engines: tuple[EngineUsage, ...] = ()) -> Point:
    """`time_scale` turns wall time back into modelled time (a simulator's --speed)."""
    ok = [r for r in records if r.ok]
    warm = [r.ttft_ms * time_scale for r in ok if r.turn >= 1 and r.ttft_ms is not None]
    gaps = [r.itl_max_ms * time_scale for r in ok if r.itl_max_ms is not None]
    return Point(leg, sessions, len(records), len(records) - len(ok), percentile(warm, 50), percentile(warm, 90),
                 percentile(gaps, 99), max(gaps, default=math.nan), engines)


Play = Callable[[int], Sequence[RequestRecord]]
"""Plays N sessions against the leg's deployment and returns their records."""


def measured(leg: str, play: Play, n: int, time_scale: float = 1.0, meter: Meter | None = None) -> Point:
    """One point: N sessions played, the engines metered over exactly that span."""
    if meter is None:
        return point(leg, n, play(n), time_scale)
    meter.start()
    started = time.monotonic()
    records = play(n)
    span_ms = (time.monotonic() - started) * 1000.0 * time_scale
    return point(leg, n, records, time_scale, meter.stop(span_ms))


def sweep(leg: str, play: Play, sessions: Sequence[int], time_scale: float = 1.0,
          meter: Meter | None = None) -> list[Point]:
    return [measured(leg, play, n, time_scale, meter) for n in sessions]


def measure(leg: str, play: Play, opts: CapacityOptions, time_scale: float = 1.0,
            meter: Meter | None = None) -> list[Point]:
    """The sweep when session counts are given, else the search."""
    if opts.sessions:
        return sweep(leg, play, opts.sessions, time_scale, meter)
    return search(leg, play, opts.slo, opts.limit, time_scale, meter)


def search(leg: str, play: Play, slo: Slo, limit: int = SEARCH_LIMIT, time_scale: float = 1.0,
           meter: Meter | None = None) -> list[Point]:
    """Double N while the SLO holds, then bisect between the last N within it and the first outside."""
    points: dict[int, Point] = {}

    def probe(n: int) -> bool:
        if n not in points:
            points[n] = measured(leg, play, n, time_scale, meter)
        return points[n].within(slo)

    good, bad, n = 0, 0, 1
    while n <= limit:
        if not probe(n):
            bad = n
            break
        good, n = n, n * 2
    while bad and bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if probe(mid) else (good, mid)
    return [points[k] for k in sorted(points)]


def largest_within(points: Sequence[Point], slo: Slo) -> int:
    """The largest N within the SLO such that every smaller measured N is within it too (0: none)."""
    best = 0
    for p in sorted(points, key=lambda p: p.sessions):
        if not p.within(slo):
            break
        best = p.sessions
    return best


def table(points: Sequence[Point], slo: Slo) -> list[str]:
    """Markdown: every point, then the largest N within the SLO per leg."""
    legs = list(dict.fromkeys(p.leg for p in points))
    usage = any(p.engines for p in points)
    extra = " GPU busy % | KV peak % |" if usage else ""
    lines = ["| leg | sessions | requests | failed | warm TTFT p50 | warm TTFT p90 | ITL p99 (largest gap) | "
             f"largest gap |{extra} within SLO |", "|---|---|---|---|---|---|---|---|---|" + ("---|---|" * usage)]
    for p in points:
        cells = f" {busy_cell(p.engines)} | {kv_cell(p.engines)} |" if usage else ""
        lines.append(f"| {p.leg} | {p.sessions} | {p.requests} | {p.failed} | {_ms(p.ttft_p50)} | {_ms(p.ttft_p90)} "
                     f"| {_ms(p.itl_p99)} | {_ms(p.itl_max)} |{cells} {'yes' if p.within(slo) else 'no'} |")
    lines += ["", f"Largest number of sessions within the SLO ({slo.describe()}):", "",
              "| leg | sessions within SLO |", "|---|---|"]
    lines += [f"| {leg} | {largest_within([p for p in points if p.leg == leg], slo)} |" for leg in legs]
    return lines


def _short(engine: str) -> str:
    """prefill-0 -> P0, decode-1 -> D1, aggregated-0 -> A0."""
    role, _, index = engine.rpartition("-")
    return f"{role[:1].upper()}{index}" if role else engine


def busy_cell(engines: Sequence[EngineUsage]) -> str:
    """`P0 41, D0 87`: each engine's modelled busy %; "-" when none has a step model."""
    parts = [f"{_short(e.engine)} {100 * e.busy:.0f}" for e in engines if e.busy is not None]
    return ", ".join(parts) or "-"


def kv_cell(engines: Sequence[EngineUsage]) -> str:
    """`P0 12, D0 ≤85`: each engine's KV high-water %, with ≤ where the mark was set before this point (the point's
    own peak was at most that)."""
    parts = [f"{_short(e.engine)} {'' if e.kv_peak_in_span else '≤'}{100 * e.kv_peak:.0f}"
             for e in engines if e.kv_peak is not None]
    return ", ".join(parts) or "-"


def _rounded(v: Any) -> Any:
    return round(v, 2) if isinstance(v, float) and math.isfinite(v) else v


def _ms(v: float) -> str:
    return f"{v:.0f}" if math.isfinite(v) else "-"
