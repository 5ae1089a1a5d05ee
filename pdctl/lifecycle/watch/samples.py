"""Prometheus samples as `pdctl top` reads them: the text format parsed into name -> labels -> value, and the
arithmetic over two samples that Prometheus's `rate` and `histogram_quantile` do."""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
Samples = dict[str, dict[Labels, float]]  # sample name (with _bucket/_sum/_count/_total) -> labels -> value


def parse(text: str) -> Samples:
    """One /metrics body: sample name (with its _bucket/_sum/_count/_total suffix) -> labels -> value."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def sum_of(samples: Samples, name: str, **match: str) -> float:
    """The sum of a sample's series whose labels include `match`."""
    return sum(v for labels, v in samples.get(name, {}).items() if all((k, m) in labels for k, m in match.items()))


def by_labels(samples: Samples, name: str, *keys: str, **match: str) -> dict[tuple[str, ...], float]:
    """A sample's series matching `match`, summed by the values of `keys`."""
    out: dict[tuple[str, ...], float] = {}
    for labels, v in samples.get(name, {}).items():
        d = dict(labels)
        if all(d.get(k) == m for k, m in match.items()):
            key = tuple(d.get(k, "") for k in keys)
            out[key] = out.get(key, 0.0) + v
    return out


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus's histogram_quantile over cumulative bucket counts (upper bound -> count); None without data."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if math.isinf(b):
                return prev_bound
            if c == prev_count:
                return b
            return prev_bound + (b - prev_bound) * (rank - prev_count) / (c - prev_count)
        prev_bound, prev_count = b, c
    return bounds[-1]


def delta(now: Samples, before: Samples, name: str) -> dict[Labels, float]:
    """A counter's increase per series between two samples (a restart's reset reads as 0, not negative)."""
    old = before.get(name, {})
    return {k: max(0.0, v - old.get(k, 0.0)) for k, v in now.get(name, {}).items()}


def quantiles(now: Samples, before: Samples, name: str, **match: str) -> dict[str, float | None]:
    """p50/p90/p99 of a histogram over the interval between two samples."""
    buckets: dict[float, float] = {}
    for labels, v in delta(now, before, f"{name}_bucket").items():
        d = dict(labels)
        if all(d.get(k) == m for k, m in match.items()):
            le = float(d["le"])
            buckets[le] = buckets.get(le, 0.0) + v
    return {f"p{int(q * 100)}": quantile(q, buckets) for q in (0.5, 0.9, 0.99)}


def merge(parts: Iterable[Samples]) -> Samples:
    """Several processes' samples as one (series summed)."""
    out: Samples = {}
    for part in parts:
        for name, series in part.items():
            into = out.setdefault(name, {})
            for k, v in series.items():
                into[k] = into.get(k, 0.0) + v
    return out
