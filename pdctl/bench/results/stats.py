"""Aggregations over request records: per leg and length summaries, reuse counts, baseline/leg TTFT ratios.

"warm" turns are turn >= 1, the ones that can reuse the decode's KV; turn 0 is cold on every leg.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pdctl.bench.results.records import LegResult, RequestRecord
from pdctl.router.wire import DECODE_LOCAL

METRICS = ("ttft_ms", "tpot_ms", "latency_ms", "prefill_ms")


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default), p in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass(frozen=True)
class ReuseCounts:
    eligible: int
    hit: int
    partial: int
    miss: int
    unknown: int
    local: int = 0  # hits the decode ran alone (the router's conditional disaggregation)

    @property
    def rate(self) -> float:
        return (self.hit + self.partial) / self.eligible if self.eligible else math.nan


def reuse_counts(records: Iterable[RequestRecord]) -> ReuseCounts:
    """Reuse outcomes of the successful warm turns (the ones that could have reused KV)."""
    warm = [r for r in records if r.turn >= 1 and r.ok]
    outcomes = [r.reuse for r in warm]
    return ReuseCounts(
        eligible=len(warm),
        hit=outcomes.count("hit"),
        partial=outcomes.count("partial"),
        miss=outcomes.count("miss"),
        unknown=sum(1 for o in outcomes if o not in ("hit", "partial", "miss")),
        local=sum(1 for r in warm if r.reuse_reason == DECODE_LOCAL),
    )


@dataclass(frozen=True)
class SummaryRow:
    leg: str
    length: int
    scope: str
    requests: int
    input_tokens_mean: float
    values: dict[str, tuple[float, float, float]]
    hit_rate: float

    def mean(self, metric: str) -> float:
        return self.values[metric][0]

    def csv_row(self) -> dict[str, object]:
        row: dict[str, object] = {
            "leg": self.leg,
            "length": self.length,
            "scope": self.scope,
            "requests": self.requests,
            "input_tokens_mean": _r(self.input_tokens_mean),
        }
        for metric, (mean, median, p90) in self.values.items():
            base = metric.removesuffix("_ms")
            row[f"{base}_mean_ms"], row[f"{base}_median_ms"], row[f"{base}_p90_ms"] = _r(mean), _r(median), _r(p90)
        row["hit_rate"] = _r(self.hit_rate, 3)
        return row


def summarize(legs: Sequence[LegResult]) -> list[SummaryRow]:
    rows = []
    for leg in legs:
        for length in lengths_of(leg.records):
            for scope in ("warm", "first"):
                recs = [r for r in leg.records if r.length == length and _in_scope(r, scope) and r.ok]
                if recs:
                    rows.append(_row(leg.name, length, scope, recs))
    return rows


def _in_scope(r: RequestRecord, scope: str) -> bool:
    return r.turn >= 1 if scope == "warm" else r.turn == 0


def _row(leg: str, length: int, scope: str, recs: list[RequestRecord]) -> SummaryRow:
    values = {}
    for metric in METRICS:
        xs = [float(v) for r in recs if (v := getattr(r, metric)) is not None]
        values[metric] = (
            (statistics.fmean(xs), statistics.median(xs), percentile(xs, 90)) if xs else (math.nan,) * 3
        )
    tokens = [float(r.input_num_tokens) for r in recs if r.input_num_tokens is not None]
    return SummaryRow(
        leg=leg,
        length=length,
        scope=scope,
        requests=len(recs),
        input_tokens_mean=statistics.fmean(tokens) if tokens else math.nan,
        values=values,
        hit_rate=reuse_counts(recs).rate if scope == "warm" else math.nan,
    )


def lengths_of(records: Iterable[RequestRecord]) -> list[int]:
    return sorted({r.length for r in records})


def warm_mean(rows: Sequence[SummaryRow], leg: str, length: int, metric: str = "ttft_ms") -> float:
    for row in rows:
        if row.leg == leg and row.length == length and row.scope == "warm":
            return row.mean(metric)
    return math.nan


def ratios(rows: Sequence[SummaryRow], legs: Sequence[str]) -> dict[str, dict[int, float]]:
    """Mean warm TTFT of the first (baseline) leg divided by each other leg's, per length."""
    if len(legs) < 2:
        return {}
    base = legs[0]
    lengths = sorted({r.length for r in rows})
    out: dict[str, dict[int, float]] = {}
    for leg in legs[1:]:
        out[leg] = {}
        for length in lengths:
            b, x = warm_mean(rows, base, length), warm_mean(rows, leg, length)
            out[leg][length] = b / x if x and not math.isnan(x) and not math.isnan(b) else math.nan
    return out


def _r(x: float, digits: int = 2) -> float | str:
    return "" if math.isnan(x) else round(x, digits)
