"""Every miss explains itself: a reason on every turn, and for a diverged prefix the first block that differed,
whether the router or the prefill verified it."""

from __future__ import annotations

from array import array

from pdctl import prefix_check
from pdctl.router.turn.verify import at_prefill, settle, verify
from pdctl.router.wire import KV_SOURCES, PREFIX_DIVERGED, REASON_TEXT, REASONS, Reuse, kv_source

HELD = array("i", range(100, 180))  # 80 tokens: 5 blocks of 16


def _params(n: int = 80) -> dict[str, object]:
    return {"remote_num_tokens": n, "remote_block_ids": list(range(5)), "remote_engine_id": "d"}


def test_the_router_names_the_first_block_that_differed() -> None:
    edited = array("i", [*HELD[:40], 7, *HELD[41:], 1, 2])  # token 40: block 2
    v = verify(_params(), HELD, edited, 16)
    assert (v.outcome, v.tokens, v.block) == ("partial", 32, 2)
    assert v.header == "partial;tokens=32;block=2;reason=prefix_diverged"
    miss = verify(_params(), HELD, array("i", [7, *HELD[1:], 1]), 16)
    assert (miss.outcome, miss.block) == ("miss", 0)
    assert verify(_params(), HELD, array("i", [*HELD, 1]), 16).block is None  # a hit says nothing of blocks


def test_the_prefill_reports_where_and_the_router_reads_it_as_a_block() -> None:
    held = list(range(1000, 1800))  # 800 tokens: chunks of 256 at block size 16
    spec = prefix_check.spec(held, 800, 16)
    pending = at_prefill({"remote_num_tokens": 800, "remote_block_ids": list(range(50))}, spec)
    sent = dict(pending.params)
    report = prefix_check.check(sent, [*held[:300], 7, *held[301:], 1])
    assert report == {"outcome": "partial", "tokens": 256, "reason": PREFIX_DIVERGED, "cached": 0, "read": 256,
                      "diverged_at": 256}
    v = settle(pending, sent)
    assert v is not None and (v.outcome, v.tokens, v.block) == ("partial", 256, 16)
    older = settle(pending, {prefix_check.REPORT: {"outcome": "miss", "tokens": 0, "reason": PREFIX_DIVERGED}})
    assert older is not None and older.block is None  # a prefill whose check predates the position


def test_the_header_round_trips_and_old_readers_still_find_the_reason() -> None:
    r = Reuse("miss", 0, PREFIX_DIVERGED, block=3)
    assert Reuse.parse(r.header) == r
    assert r.header.rsplit("reason=", 1)[-1] == PREFIX_DIVERGED
    assert Reuse.parse("miss;tokens=0;block=x;reason=prefix_diverged").outcome == "malformed"
    assert "first differing block 3" in r.explanation


def test_every_reason_has_words_and_a_kv_source() -> None:
    assert set(REASON_TEXT) == REASONS
    assert kv_source("hit", "verified") == "decode_read" and kv_source("hit", "decode_local") == "decode_cache"
    assert kv_source("miss", "whole_prefill") == "prefill_whole" and kv_source("miss", "expired") == "recomputed"
    # One account for the metric and the bench: the prefill's own cache whether it said so or read nothing, a
    # conversation that stayed on its prefill is still served there, and a miss never counts as a read.
    assert kv_source("hit", "prefill_cached", 0) == kv_source("hit", "verified", 0) == "prefill_cache"
    assert kv_source("hit", "verified", 300) == kv_source("partial", "prefix_diverged") == "decode_read"
    assert kv_source("hit", "whole_prefill") == "prefill_whole" and kv_source("miss", "read_not_worth") == "recomputed"
    assert {kv_source("hit", r) for r in REASONS} | {kv_source("miss", r) for r in REASONS} <= set(KV_SOURCES)
