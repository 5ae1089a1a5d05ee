"""The bench's KV-transfer figures, from what the prefills say about themselves (pdctl.engine_metrics reads their
`/metrics` or their `KV Transfer metrics` log lines into one shape).
"""

from __future__ import annotations

from collections.abc import Iterable

from pdctl.bench.records import KvTransfer
from pdctl.engine_metrics import (
    NIXL_BYTES,
    NIXL_DESCRIPTORS,
    NIXL_EXPIRED,
    NIXL_FAILED,
    NIXL_XFER_COUNT,
    NIXL_XFER_SECONDS,
    Samples,
    kv_log_samples,
)


def nixl_delta(before: Samples, after: Samples, source: str = "metrics") -> KvTransfer:
    """KV transfer between two scrapes of the same instances (counters only grow; a restart reads as after)."""

    def d(name: str) -> float:
        a, b = after.get(name, 0.0), before.get(name, 0.0)
        return a - b if a >= b else a

    return KvTransfer(
        transfers=int(d(NIXL_XFER_COUNT)),
        xfer_ms=d(NIXL_XFER_SECONDS) * 1000.0,
        bytes=d(NIXL_BYTES),
        descriptors=d(NIXL_DESCRIPTORS),
        failed=int(d(NIXL_FAILED)),
        expired=int(d(NIXL_EXPIRED)),
        source=source,
    )


def kv_from_log(lines: Iterable[str]) -> KvTransfer:
    """Total KV transfer from every `KV Transfer metrics` line; averages are weighted by their transfer counts."""
    return nixl_delta({}, kv_log_samples(lines), source="log")
