"""Reading what an engine (vLLM, or the simulator) says about itself: its `/metrics` Prometheus text, and the
`KV Transfer metrics:` lines its NIXL connector logs where it has no metrics. Both read into one shape, `Samples`.

Pure and tolerant: lines and keys it does not know are skipped, never fatal. `pdctl status` (lifecycle/watch/status.py)
and the bench's KV meter (bench/runner/collect.py) read through here; it imports nothing of pdctl.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

Samples = dict[str, float]
"""Metric name (with `_sum`/`_count`/`_total` suffix) -> value summed over every label set."""

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
NIXL_XFER_COUNT = "vllm:nixl_xfer_time_seconds_count"
NIXL_XFER_SECONDS = "vllm:nixl_xfer_time_seconds_sum"
NIXL_BYTES = "vllm:nixl_bytes_transferred_sum"
NIXL_DESCRIPTORS = "vllm:nixl_num_descriptors_sum"
NIXL_FAILED = "vllm:nixl_num_failed_transfers_total"
NIXL_EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"

KV_LOG_NEEDLE = "KV Transfer metrics"
MIB = 2**20

# A sample line: name, optional labels (quoted values may hold `}`), value; a timestamp may follow.
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)')
_LOG = re.compile(r"KV Transfer metrics:\s*(.*)$")


def parse_prometheus(text: str) -> Samples:
    """Sum each sample name over its label sets; `_bucket` and `_created` lines are dropped."""
    out: Samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1).endswith(("_bucket", "_created")):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def has_nixl(samples: Samples) -> bool:
    return NIXL_XFER_COUNT in samples


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


def kv_log_samples(lines: Iterable[str]) -> Samples:
    """Every `KV Transfer metrics` line read as the NIXL counters /metrics would show (averages weighted by their
    transfer counts), so a log and a scrape compare alike."""
    out: Samples = {}

    def add(name: str, value: float) -> None:
        out[name] = out.get(name, 0.0) + value

    for line in lines:
        f = parse_kv_log_line(line)
        if f is None:
            continue
        n = f.get("Num successful transfers", 0.0)
        add(NIXL_XFER_COUNT, n)
        add(NIXL_XFER_SECONDS, n * f.get("Avg xfer time (ms)", 0.0) / 1000.0)
        add(NIXL_BYTES, n * f.get("Avg MB per transfer", 0.0) * MIB)
        add(NIXL_DESCRIPTORS, n * f.get("Avg number of descriptors", 0.0))
        add(NIXL_FAILED, f.get("Num failed transfers", 0.0))
        add(NIXL_EXPIRED, f.get("Num KV expired reqs", 0.0))
    return out
