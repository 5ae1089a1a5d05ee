"""Capacity at an SLO: play N agent sessions per point, a sweep over N or a search for the largest N within the SLO.

A point's TTFT is over its warm turns (turn >= 1); its inter-token figure is the p99 over requests of each
request's largest gap between two streamed chunks (stricter than the p99 of all gaps: a stall counts whole).
A point with any failed request is outside every SLO. On the simulator the points are in modelled time: wall
time times sim.speed (the records themselves keep wall time, as every bench record does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from pdctl.bench.agent import AgentSpec
from pdctl.bench.records import RequestRecord
from pdctl.bench.stats import percentile
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

    def within(self, slo: Slo) -> bool:
        return (self.failed == 0 and self.ttft_p50 <= slo.ttft_p50 and self.ttft_p90 <= slo.ttft_p90
                and self.itl_p99 <= slo.itl_p99)

    def to_json(self) -> dict[str, float | int | str]:
        return {k: (round(v, 2) if isinstance(v, float) and math.isfinite(v) else v) for k, v in asdict(self).items()}


def point(leg: str, sessions: int, records: Sequence[RequestRecord], time_scale: float = 1.0) -> Point:
    """`time_scale` turns wall time back into modelled time (a simulator's --speed)."""
    ok = [r for r in records if r.ok]
    warm = [r.ttft_ms * time_scale for r in ok if r.turn >= 1 and r.ttft_ms is not None]
    gaps = [r.itl_max_ms * time_scale for r in ok if r.itl_max_ms is not None]
    return Point(leg, sessions, len(records), len(records) - len(ok), percentile(warm, 50), percentile(warm, 90),
                 percentile(gaps, 99), max(gaps, default=math.nan))


Play = Callable[[int], Sequence[RequestRecord]]
"""Plays N sessions against the leg's deployment and returns their records."""


def sweep(leg: str, play: Play, sessions: Sequence[int], time_scale: float = 1.0) -> list[Point]:
    return [point(leg, n, play(n), time_scale) for n in sessions]


def measure(leg: str, play: Play, opts: CapacityOptions, time_scale: float = 1.0) -> list[Point]:
    """The sweep when session counts are given, else the search."""
    if opts.sessions:
        return sweep(leg, play, opts.sessions, time_scale)
    return search(leg, play, opts.slo, opts.limit, time_scale)


def search(leg: str, play: Play, slo: Slo, limit: int = SEARCH_LIMIT, time_scale: float = 1.0) -> list[Point]:
    """Double N while the SLO holds, then bisect between the last N within it and the first outside."""
    points: dict[int, Point] = {}

    def probe(n: int) -> bool:
        if n not in points:
            points[n] = point(leg, n, play(n), time_scale)
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
    lines = ["| leg | sessions | requests | failed | warm TTFT p50 | warm TTFT p90 | ITL p99 (largest gap) | "
             "largest gap | within SLO |", "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.leg} | {p.sessions} | {p.requests} | {p.failed} | {_ms(p.ttft_p50)} | {_ms(p.ttft_p90)} "
                     f"| {_ms(p.itl_p99)} | {_ms(p.itl_max)} | {'yes' if p.within(slo) else 'no'} |")
    lines += ["", f"Largest number of sessions within the SLO ({slo.describe()}):", "",
              "| leg | sessions within SLO |", "|---|---|"]
    lines += [f"| {leg} | {largest_within([p for p in points if p.leg == leg], slo)} |" for leg in legs]
    return lines


def _ms(v: float) -> str:
    return f"{v:.0f}" if math.isfinite(v) else "-"
