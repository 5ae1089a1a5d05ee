"""The router's lean Counter and Histogram write the same /metrics text as prometheus_client's own."""

from __future__ import annotations

import re

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pdctl.router import lean_metrics

BUCKETS = (0, 0.001, 0.0025, 0.5, 1, 10)
VALUES = (0, 0.0005, 0.001, 0.0011, 0.3, 0.5, 1, 7, 11, 1e9, 0.25, 0.001)


def _text(registry: CollectorRegistry) -> str:
    return re.sub(r"^(\S+_created(?:\{[^}]*\})?) \S+$", r"\1 T", generate_latest(registry).decode(), flags=re.M)


def _fill(counter: type[prometheus_client.Counter], histogram: type[prometheus_client.Histogram]) -> str:
    r = CollectorRegistry()
    c = counter("pdctl_test_things", "Things.", ["kind"], registry=r)
    plain = counter("pdctl_test_plain", "Plain.", registry=r)
    h = histogram("pdctl_test_seconds", "Seconds.", ["kind"], buckets=BUCKETS, registry=r)
    one = histogram("pdctl_test_tokens", "Tokens.", buckets=BUCKETS, registry=r)
    c.labels("a")
    for i, v in enumerate(VALUES):
        c.labels("b").inc(v)
        plain.inc()
        h.labels("odd" if i % 2 else "even").observe(v)
        one.observe(v)
    return _text(r)


def test_same_exposition_as_prometheus_client() -> None:
    lean = _fill(lean_metrics.Counter, lean_metrics.Histogram)
    assert lean == _fill(prometheus_client.Counter, prometheus_client.Histogram)
    assert 'pdctl_test_seconds_bucket{kind="even",le="0.001"} 2.0' in lean
    assert 'pdctl_test_seconds_bucket{kind="odd",le="0.001"} 2.0' in lean
    assert "pdctl_test_tokens_count 12.0" in lean
    assert "pdctl_test_tokens_sum 1.0000000200536001e+09" in lean


def test_counter_refuses_a_negative_amount() -> None:
    c = lean_metrics.Counter("pdctl_test_neg", "Neg.", registry=CollectorRegistry())
    with pytest.raises(ValueError):
        c.inc(-1)
