from __future__ import annotations

from dataclasses import replace

from pdctl.bench.leg.guards import check
from tests.bench.recorded import leg


def test_real_runs_pass() -> None:
    assert check(leg("on", True)) == []
    assert check(leg("off", False)) == []


def test_an_on_leg_forced_to_miss_fails_with_the_reason() -> None:
    on = leg("on", True)
    warm = [r for r in on.records if r.turn >= 1]
    for r in warm[:3]:
        r.reuse, r.reuse_reason = "miss", "prefix-mismatch"
    failures = check(on)
    assert failures == ["KV reuse on 13 of 16 warm turns (81%, need 90%); misses: prefix-mismatch x3"]


def test_missing_router_header_counts_as_a_miss() -> None:
    on = leg("on", True)
    for r in on.records:
        r.reuse = None
    assert check(on) == ["KV reuse on 0 of 16 warm turns (0%, need 90%); misses: no X-PD-KV-Reuse header x16"]


def test_off_leg_misses_are_fine_but_failures_and_empty_replies_are_not() -> None:
    off = leg("off", False)
    off.records[0] = replace(off.records[0], status=502, error="upstream decode unreachable")
    off.records[5] = replace(off.records[5], output_num_tokens=0)
    assert check(off) == [
        "1 of 24 requests failed (first: off-L2000-c0-94650302 turn 0: upstream decode unreachable)",
        f"1 responses had zero output tokens (first: {off.records[5].conversation_id} turn {off.records[5].turn})",
    ]


def test_an_on_leg_without_warm_turns_cannot_prove_reuse() -> None:
    on = leg("on", True)
    on.records = [r for r in on.records if r.turn == 0]
    assert check(on) == ["no successful warm turns to check KV reuse on (use --turns 2 or more)"]
