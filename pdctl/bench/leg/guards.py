"""Guards that fail a leg, and so the bench: failed requests, empty responses, and, on a leg with bidirectional
transfer on, fewer than `MIN_HIT_RATE` of the warm turns reusing the decode's KV (a fast ON curve that did not
reuse anything would prove nothing).
"""

from __future__ import annotations

from collections import Counter

from pdctl.bench.results.records import LegResult
from pdctl.bench.results.stats import reuse_counts

MIN_HIT_RATE = 0.9


def check(leg: LegResult, count_failed: bool = True) -> list[str]:
    """Every reason this leg fails, in words the report can print as they are; empty when it passes.
    A capacity run passes count_failed=False: failures past capacity put a point outside the SLO instead."""
    failures: list[str] = []
    failed = [r for r in leg.records if not r.ok]
    if failed and count_failed:
        first = failed[0]
        failures.append(
            f"{len(failed)} of {len(leg.records)} requests failed "
            f"(first: {first.conversation_id} turn {first.turn}: {first.error or f'HTTP {first.status}'})"
        )
    empty = [r for r in leg.records if r.ok and r.output_num_tokens == 0]
    if empty:
        failures.append(
            f"{len(empty)} responses had zero output tokens (first: {empty[0].conversation_id} turn {empty[0].turn})"
        )
    if leg.bidirectional:
        failures.extend(_reuse(leg))
    return failures


def _reuse(leg: LegResult) -> list[str]:
    counts = reuse_counts(leg.records)
    if counts.eligible == 0:
        return ["no successful warm turns to check KV reuse on (use --turns 2 or more)"]
    if counts.rate >= MIN_HIT_RATE:
        return []
    reasons = Counter(
        r.reuse_reason or r.reuse or "no X-PD-KV-Reuse header"
        for r in leg.records
        if r.turn >= 1 and r.ok and r.reuse not in ("hit", "partial")
    )
    shown = ", ".join(f"{reason} x{n}" for reason, n in reasons.most_common(4))
    return [
        f"KV reuse on {counts.hit + counts.partial} of {counts.eligible} warm turns "
        f"({counts.rate:.0%}, need {MIN_HIT_RATE:.0%}); misses: {shown}"
    ]
