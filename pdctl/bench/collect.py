"""Collectors: the prefill's NIXL metrics (Prometheus text or `KV Transfer metrics` log lines) and the router's
reuse header. All parsers are pure and tolerant: unknown keys and lines are skipped, never fatal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from pdctl.bench.records import KvTransfer

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LOG = re.compile(r"KV Transfer metrics:\s*(.*)$")
MIB = 2**20

Samples = dict[str, float]
"""Metric name (with `_sum`/`_count`/`_total` suffix) -> value summed over every label set."""


def parse_prometheus(text: str) -> Samples:
    """Sum each sample name over its label sets; `_bucket` and `_created` lines are dropped."""
    out: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if not m or m.group(1).endswith(("_bucket", "_created")):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def has_nixl(samples: Samples) -> bool:
    return "vllm:nixl_xfer_time_seconds_count" in samples


def nixl_delta(before: Samples, after: Samples) -> KvTransfer:
    """KV transfer between two scrapes of the same instances (counters only grow; a restart reads as after)."""

    def d(name: str) -> float:
        a, b = after.get(name, 0.0), before.get(name, 0.0)
        return a - b if a >= b else a

    return KvTransfer(
        transfers=int(d("vllm:nixl_xfer_time_seconds_count")),
        xfer_ms=d("vllm:nixl_xfer_time_seconds_sum") * 1000.0,
        bytes=d("vllm:nixl_bytes_transferred_sum"),
        descriptors=d("vllm:nixl_num_descriptors_sum"),
        failed=int(d("vllm:nixl_num_failed_transfers_total")),
        expired=int(d("vllm:nixl_num_kv_expired_reqs_total")),
        source="metrics",
    )


def parse_kv_log_line(line: str) -> dict[str, float] | None:
    """The key/value pairs of one `KV Transfer metrics:` line (old 8-key or new 10-key format), else None."""
    m = _LOG.search(line)
    if not m:
        return None
    fields: dict[str, float] = {}
    for part in m.group(1).split(", "):
        key, sep, raw = part.partition("=")
        if not sep:
            continue
        try:
            fields[key.strip()] = float(raw.strip().rstrip(","))
        except ValueError:
            continue
    return fields or None


def kv_from_log(lines: Iterable[str]) -> KvTransfer:
    """Total KV transfer from every `KV Transfer metrics` line; averages are weighted by their transfer counts."""
    total = KvTransfer(source="log")
    for line in lines:
        f = parse_kv_log_line(line)
        if f is None:
            continue
        n = f.get("Num successful transfers", 0.0)
        total = total + KvTransfer(
            transfers=int(n),
            xfer_ms=n * f.get("Avg xfer time (ms)", 0.0),
            bytes=n * f.get("Avg MB per transfer", 0.0) * MIB,
            descriptors=n * f.get("Avg number of descriptors", 0.0),
            failed=int(f.get("Num failed transfers", 0.0)),
            expired=int(f.get("Num KV expired reqs", 0.0)),
            source="log",
        )
    return total


@dataclass(frozen=True)
class Reuse:
    """The router's `X-PD-KV-Reuse: hit|partial|miss;tokens=N;reason=...` header."""

    outcome: str
    tokens: int | None = None
    reason: str | None = None

    @property
    def reused(self) -> bool:
        return self.outcome in ("hit", "partial")


def parse_reuse(header: str | None) -> Reuse | None:
    if not header or not header.strip():
        return None
    outcome, *params = (p.strip() for p in header.split(";"))
    values = dict(p.partition("=")[::2] for p in params if "=" in p)
    tokens = values.get("tokens", "")
    return Reuse(
        outcome=outcome.lower(),
        tokens=int(tokens) if tokens.isdigit() else None,
        reason=values.get("reason") or None,
    )


def parse_ms(header: str | None) -> float | None:
    try:
        return float(header) if header is not None else None
    except ValueError:
        return None
