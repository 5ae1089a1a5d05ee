"""The router's public signals (pdctl.router.wire): the X-PD-KV-Reuse header and the /stats document."""

from __future__ import annotations

import uuid

import pytest

from pdctl.lifecycle.watch.status import router_stats
from pdctl.remote.local import LocalTransport
from pdctl.router import wire
from pdctl.router.wire import Reuse, RouterStats, UpstreamStats
from tests.router.conftest import RouterProc
from tests.router.talk import Conversation
from tests.support.sim_procs import SimPair


def test_the_header_bytes_and_their_round_trip() -> None:
    assert Reuse("hit", 10, "verified").header == "hit;tokens=10;reason=verified"
    assert Reuse("miss", 0, wire.N_GT_1).raw() == (b"x-pd-kv-reuse", b"miss;tokens=0;reason=n_gt_1")
    for outcome in ("hit", "partial", "miss"):
        for reason in sorted(wire.REASONS):
            r = Reuse(outcome, 4096, reason)  # type: ignore[arg-type]
            assert Reuse.parse(r.header) == r
            assert r.reused == (outcome != "miss")


def test_parse_reads_what_the_router_and_older_readers_wrote() -> None:
    hit = Reuse.parse("hit;tokens=2315;reason=handle")
    assert hit.outcome == "hit" and hit.tokens == 2315 and hit.reused
    miss = Reuse.parse("miss;tokens=0;reason=prefix-mismatch")
    assert not miss.reused and miss.reason == "prefix-mismatch"
    assert Reuse.parse("partial") == Reuse.parse(" partial ") == Reuse("partial", 0, "")
    assert Reuse.parse("HIT;reason=verified;future=1") == Reuse("hit", 0, "verified")  # unknown keys skipped
    assert Reuse.parse(None) == Reuse.parse("") == Reuse.parse("  ") == Reuse("absent", 0, "no X-PD-KV-Reuse header")


@pytest.mark.parametrize(("value", "why"), [
    ("garbage", "outcome 'garbage' is none of hit, partial, miss"),
    ("hot;tokens=1;reason=verified", "outcome 'hot' is none of hit, partial, miss"),
    ("hit;tokens=ten;reason=verified", "tokens='ten' is not a count"),
    ("hit;tokens=-3;reason=verified", "tokens='-3' is not a count"),
    ("miss;tokens=0;reason=a, miss;tokens=0;reason=b", "a list of values (read it with Reuse.parse_list)"),
])
def test_a_malformed_header_reads_as_malformed_with_the_value(value: str, why: str) -> None:
    r = Reuse.parse(value)
    assert r == Reuse("malformed", 0, f"unreadable X-PD-KV-Reuse header {value!r}: {why}")
    assert not r.reused


def test_a_list_of_prompts_reads_one_value_each() -> None:
    assert Reuse.parse_list("miss;tokens=0;reason=new_conversation, hit;tokens=32;reason=verified") == [
        Reuse("miss", 0, "new_conversation"), Reuse("hit", 32, "verified")]
    assert Reuse.parse_list("hit;tokens=1;reason=verified") == [Reuse("hit", 1, "verified")]
    assert Reuse.parse_list(None) == [Reuse.parse(None)]


def test_parse_ms() -> None:
    assert wire.parse_ms("12.5") == 12.5
    assert wire.parse_ms(None) is None and wire.parse_ms("soon") is None


def test_router_stats_from_a_running_router(router: RouterProc, pd: SimPair) -> None:
    conv = Conversation(router.url, True, False, "body", uuid.uuid4().hex)
    conv.turn(f"{uuid.uuid4().hex} tell me about the sea and the sky and the long road home")
    assert conv.turn("and then?").outcome == "hit"
    doc = router.stats()
    stats = RouterStats.from_json(doc)
    assert stats.to_json() == doc  # the type holds every field the router writes, and writes them back alike
    assert stats.requests_total >= 2 and stats.hit >= 1 and stats.reuse_reasons[wire.VERIFIED] >= 1
    assert set(stats.reuse_reasons) <= wire.REASONS
    assert stats.prefill == (UpstreamStats(pd.prefill_url, True, 0, 0, stats.prefill[0].generation),)
    assert [u.url for u in stats.decode] == [pd.decode_url] and stats.version
    status = router_stats(LocalTransport(), router.url)  # as `pdctl status` reads it
    assert status.error is None and status.hit >= stats.hit and status.requests_total > stats.requests_total


@pytest.mark.parametrize(("doc", "message"), [
    ([1, 2], "router /stats: the document is not a JSON object: [1, 2]"),
    ({"reuse": {}}, "router /stats: `requests_total` is missing (is this a pdctl router?)"),
    ({"requests_total": 3}, "router /stats: `reuse` is missing (is this a pdctl router?)"),
    ({"requests_total": "3", "reuse": {}}, "router /stats: `requests_total` is not an integer: '3'"),
    ({"requests_total": True, "reuse": {}}, "router /stats: `requests_total` is not an integer: True"),
    ({"requests_total": 3, "reuse": []}, "router /stats: `reuse` is not a JSON object: []"),
    ({"requests_total": 3, "reuse": {"hit": 1.5}}, "router /stats: `reuse.hit` is not an integer: 1.5"),
    ({"requests_total": 3, "reuse": {}, "hit_rate": "high"}, "router /stats: `hit_rate` is not a number: 'high'"),
    ({"requests_total": 3, "reuse": {}, "decode": {}}, "router /stats: `decode` is not a list: {}"),
    ({"requests_total": 3, "reuse": {}, "decode": [{"url": "http://d", "healthy": "yes"}]},
     "router /stats: `decode[0].healthy` is not true or false: 'yes'"),
])
def test_router_stats_from_a_bad_document_names_the_field(doc: object, message: str) -> None:
    with pytest.raises(ValueError) as err:
        RouterStats.from_json(doc)
    assert str(err.value) == message


def test_router_stats_of_an_older_router_default_what_it_lacks() -> None:
    stats = RouterStats.from_json({"requests_total": 4, "reuse": {"hit": 1, "miss": 3}, "hit_rate": 0.25})
    assert (stats.hit, stats.partial, stats.miss, stats.hit_rate, stats.local_turns) == (1, 0, 3, 0.25, 0)


def test_status_reports_a_server_that_is_not_a_router(pd: SimPair) -> None:
    status = router_stats(LocalTransport(), pd.decode_url)  # an engine answers /stats with something else
    assert status.error is not None and status.error.startswith("router /stats: "), status.error
