"""Capacity at an SLO: play N agent sessions per point, a sweep over N or a search for the largest N within the SLO.

A point's TTFT is over its warm turns (turn >= 1); its inter-token figure is the p99 over requests of each
request's largest gap between two streamed chunks (stricter than the p99 of all gaps: a stall counts whole).
A point with any failed request is outside every SLO. On the simulator the points are in modelled time: wall
time times sim.speed (the records themselves keep wall time, as every bench record does).

With a meter (pdctl.bench.runner.collect.UsageMeter) each point also records each engine's busy fraction (modelled step
time over the point's modelled duration), prefill and decode tokens, and KV high-water mark; the table shows the
busy % and KV peak % per engine, "-" where an engine has no such counters (a real vLLM), and no columns at all
when no point has any.

Repeats: each point is played `runs` times (2 by default from the CLI, each run new sessions of its own seed); when
two runs' SLO figures (warm TTFT p90, ITL p99, or the SLO's own keys) differ by more than `tolerance` (10 %), a third
run is played, and the point is the pooled records of the two runs that agree best (`agreed` says whether they
agree within the tolerance). Each run's figures stay in the point's `runs`. `load` is the machine's 1-minute load
average at the end of the point's last run.
"""

from __future__ import annotations

import math
import os
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
AGREE_KEYS = ("ttft_p90", "itl_p99")  # what two runs of a point must agree on when the SLO names neither
TOLERANCE = 0.10
RUN_SEED = 1_000_000  # run r of a point plays its sessions with seed + r * RUN_SEED: new sessions, new prefix


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
    runs: int = 1  # runs per point before the agreement rule; the CLI's --runs (default 2)
    tolerance: float = TOLERANCE
    evict: bool = False  # the eviction profile: sessions sized against the prefills' KV (runner/eviction.py)

    def __post_init__(self) -> None:
        if not self.sessions and self.slo == Slo():
            raise UsageError("a capacity run needs --sweep sessions=... or --slo KEY=MS to search",
                             hint="e.g. --sweep sessions=1,2,4,8 or --slo ttft_p90=500,itl_p99=200")
        if self.runs < 1 or not 0 < self.tolerance < 1:
            raise UsageError(f"--runs must be >= 1 (got {self.runs})", hint="e.g. --runs 2")


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
    runs: tuple[Mapping[str, float], ...] = ()  # each run's SLO figures, when the point was played more than once
    agreed: bool | None = None  # the kept runs agree within the tolerance (None: one run)
    load: float | None = None  # the machine's 1-minute load average at the end of the point
    evicts: bool | None = None  # the eviction profile: the sessions' histories exceed the prefills' KV

    def __post_init__(self) -> None:
        # Points read back from legs.json as Point(**p) (scripts do) carry their engines as dicts.
        engines = tuple(e if isinstance(e, EngineUsage) else EngineUsage.from_json(e) for e in self.engines)
        object.__setattr__(self, "engines", engines)
        object.__setattr__(self, "runs", tuple(dict(r) for r in self.runs))

    def within(self, slo: Slo) -> bool:
        return (self.failed == 0 and self.ttft_p50 <= slo.ttft_p50 and self.ttft_p90 <= slo.ttft_p90
                and self.itl_p99 <= slo.itl_p99)

    def to_json(self) -> dict[str, Any]:
        optional = ("engines", "runs", "agreed", "load", "evicts")
        out: dict[str, Any] = {f.name: _rounded(getattr(self, f.name)) for f in fields(self) if f.name not in optional}
        if self.engines:
            out["engines"] = [e.to_json() for e in self.engines]
        if self.runs:
            out["runs"] = [{k: _rounded(v) for k, v in r.items()} for r in self.runs]
        out |= {k: _rounded(getattr(self, k)) for k in ("agreed", "load", "evicts") if getattr(self, k) is not None}
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


Play = Callable[[int, int], Sequence[RequestRecord]]
"""Plays N sessions (run r of the point: sessions of their own) against the leg's deployment; returns their records."""


def measured(leg: str, play: Play, n: int, time_scale: float = 1.0, meter: Meter | None = None,
             runs: int = 1, tolerance: float = TOLERANCE, slo: Slo = Slo()) -> Point:
    """One point: N sessions played `runs` times (a third when two disagree), each run metered over its own span."""
    played: list[tuple[list[RequestRecord], tuple[EngineUsage, ...]]] = []
    figures: list[Point] = []
    while len(played) < runs or another_run(figures, runs, tolerance, slo):
        records, engines = _play_once(play, n, len(played), time_scale, meter)
        played.append((records, engines))
        figures.append(point(leg, n, records, time_scale, engines))
    load = os.getloadavg()[0]
    if len(figures) == 1:
        return _with(figures[0], load=round(load, 2))
    keep = kept_runs(figures, slo)
    pooled = [r for i in keep for r in played[i][0]]
    engines = merge_engines([played[i][1] for i in keep])
    runs_json = tuple({"ttft_p90": f.ttft_p90, "itl_p99": f.itl_p99, "ttft_p50": f.ttft_p50,
                       "requests": float(f.requests), "failed": float(f.failed), "kept": float(i in keep)}
                      for i, f in enumerate(figures))
    best = point(leg, n, pooled, time_scale, engines)
    return _with(best, runs=runs_json, agreed=agree(figures[keep[0]], figures[keep[1]], tolerance, slo),
                 load=round(load, 2))


def _with(p: Point, **changes: Any) -> Point:
    data = {f.name: getattr(p, f.name) for f in fields(p)}
    return Point(**(data | changes))


def _play_once(play: Play, n: int, run: int, time_scale: float,
               meter: Meter | None) -> tuple[list[RequestRecord], tuple[EngineUsage, ...]]:
    if meter is None:
        return list(play(n, run)), ()
    meter.start()
    started = time.monotonic()
    records = list(play(n, run))
    span_ms = (time.monotonic() - started) * 1000.0 * time_scale
    return records, meter.stop(span_ms)


def agree_keys(slo: Slo) -> tuple[str, ...]:
    """The figures two runs must agree on: the SLO's own keys, else warm TTFT p90 and ITL p99."""
    return tuple(k for k in SLO_KEYS if math.isfinite(getattr(slo, k))) or AGREE_KEYS


def difference(a: float, b: float) -> float:
    """Relative difference of two figures (0 when both are 0 or both nan; inf when only one is a number)."""
    if math.isnan(a) and math.isnan(b):
        return 0.0
    if math.isnan(a) or math.isnan(b):
        return math.inf
    top = max(abs(a), abs(b))
    return abs(a - b) / top if top > 0 else 0.0


def agree(a: Point, b: Point, tolerance: float = TOLERANCE, slo: Slo = Slo()) -> bool:
    """Two runs of a point agree: every figure of `agree_keys` within `tolerance`, and both without failures or
    both with."""
    if (a.failed == 0) != (b.failed == 0):
        return False
    return all(difference(getattr(a, k), getattr(b, k)) <= tolerance for k in agree_keys(slo))


def another_run(runs: Sequence[Point], wanted: int, tolerance: float = TOLERANCE, slo: Slo = Slo()) -> bool:
    """The repeat rule: play until `wanted` runs; with two runs wanted, a third when the two disagree; never more."""
    if len(runs) < wanted:
        return True
    return wanted == 2 and len(runs) == 2 and not agree(runs[0], runs[1], tolerance, slo)


def kept_runs(runs: Sequence[Point], slo: Slo = Slo()) -> tuple[int, int]:
    """The two runs that agree best (the smallest largest relative difference), earliest first on a tie."""
    keys = agree_keys(slo)
    pairs = [(i, j) for i in range(len(runs)) for j in range(i + 1, len(runs))]

    def spread(pair: tuple[int, int]) -> tuple[bool, float]:
        a, b = runs[pair[0]], runs[pair[1]]
        return ((a.failed == 0) != (b.failed == 0), max(difference(getattr(a, k), getattr(b, k)) for k in keys))

    return min(pairs, key=spread)


def merge_engines(runs: Sequence[tuple[EngineUsage, ...]]) -> tuple[EngineUsage, ...]:
    """Each engine over the kept runs: the mean of its busy fraction, tokens, steps and CPU, its highest KV mark."""
    if len(runs) == 1:
        return runs[0]
    names = list(dict.fromkeys(e.engine for run in runs for e in run))
    out = []
    for name in names:
        es = [e for run in runs for e in run if e.engine == name]

        def mean(attr: str, es: list[EngineUsage] = es) -> float | None:
            vals = [getattr(e, attr) for e in es if getattr(e, attr) is not None]
            return sum(vals) / len(vals) if vals else None

        def count(attr: str) -> int | None:
            m = mean(attr)
            return None if m is None else round(m)

        peaks = [e.kv_peak for e in es if e.kv_peak is not None]
        out.append(EngineUsage(name, mean("busy"), count("prefill_tokens"), count("decode_tokens"),
                               max(peaks) if peaks else None, any(e.kv_peak_in_span for e in es), count("steps"),
                               mean("cpu")))
    return tuple(out)


def sweep(leg: str, play: Play, sessions: Sequence[int], time_scale: float = 1.0,
          meter: Meter | None = None, runs: int = 1, tolerance: float = TOLERANCE, slo: Slo = Slo()) -> list[Point]:
    return [measured(leg, play, n, time_scale, meter, runs, tolerance, slo) for n in sessions]


def measure(leg: str, play: Play, opts: CapacityOptions, time_scale: float = 1.0,
            meter: Meter | None = None, start: int = 1) -> list[Point]:
    """The sweep when session counts are given, else the search (from `start` sessions)."""
    if opts.sessions:
        return sweep(leg, play, opts.sessions, time_scale, meter, opts.runs, opts.tolerance, opts.slo)
    return search(leg, play, opts.slo, opts.limit, time_scale, meter, opts.runs, opts.tolerance, start)


def search(leg: str, play: Play, slo: Slo, limit: int = SEARCH_LIMIT, time_scale: float = 1.0,
           meter: Meter | None = None, runs: int = 1, tolerance: float = TOLERANCE, start: int = 1) -> list[Point]:
    """Double N from `start` while the SLO holds, then bisect between the last N within it and the first outside
    (0: below `start`, not measured)."""
    points: dict[int, Point] = {}

    def probe(n: int) -> bool:
        if n not in points:
            points[n] = measured(leg, play, n, time_scale, meter, runs, tolerance, slo)
        return points[n].within(slo)

    good, bad, n = 0, 0, max(1, start)
    while n <= limit:
        if not probe(n):
            bad = n
            break
        good, n = n, n * 2
    while bad and bad - good > 1 and good:
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
    repeats = any(p.runs for p in points)
    extra = " GPU busy % | KV peak % |" if usage else ""
    lines = ["| leg | sessions | requests | failed | warm TTFT p50 | warm TTFT p90 | ITL p99 (largest gap) | "
             f"largest gap |{extra} within SLO |" + (" runs |" if repeats else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|" * usage) + ("---|" * repeats)]
    for p in points:
        cells = f" {busy_cell(p.engines)} | {kv_cell(p.engines)} |" if usage else ""
        lines.append(f"| {p.leg} | {p.sessions} | {p.requests} | {p.failed} | {_ms(p.ttft_p50)} | {_ms(p.ttft_p90)} "
                     f"| {_ms(p.itl_p99)} | {_ms(p.itl_max)} |{cells} {'yes' if p.within(slo) else 'no'} |"
                     + (f" {runs_cell(p)} |" if repeats else ""))
    lines += ["", f"Largest number of sessions within the SLO ({slo.describe()}):", "",
              "| leg | sessions within SLO |", "|---|---|"]
    lines += [f"| {leg} | {largest_within([p for p in points if p.leg == leg], slo)} |" for leg in legs]
    return lines


def runs_cell(p: Point) -> str:
    """`2, agree` / `3, kept 1+3` / `3, apart`: how many runs the point took and which it pooled."""
    if not p.runs:
        return "1"
    kept = [str(i + 1) for i, r in enumerate(p.runs) if r.get("kept")]
    if len(p.runs) == 2 and p.agreed:
        return "2, agree"
    return f"{len(p.runs)}, kept {'+'.join(kept)}" + ("" if p.agreed else ", apart")


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
