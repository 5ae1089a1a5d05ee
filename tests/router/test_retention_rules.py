"""Retention's rules on their own (no processes): when a decode is under pressure, how much goes, and in what order."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from pdctl.router.config import RouterConfig
from pdctl.router.kv.handles import Handle, HandleTable
from pdctl.router.kv.release import ReleaseMetrics, Releaser
from pdctl.router.kv.retention import POLL_S, DecodeKv, Retention, read_decode_kv, single_turn
from pdctl.router.turn.capture import Capture
from pdctl.router.turn.context import CHAT, RequestContext
from pdctl.router.turn.keep import new_handle
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream.pools import Pool

URL = "http://d:1"
BLOCK = 16


def setup(high: float = 0.9, target: float = 0.8) -> tuple[Retention, HandleTable, list[tuple[str, str]]]:
    dropped: list[tuple[str, str]] = []
    table = HandleTable(100, clock=lambda: 0.0, on_drop=lambda h, why: dropped.append((h.conversation, why)),
                        block_size=BLOCK)
    registry = CollectorRegistry()
    releaser = Releaser(Pool("prefill", ["http://p:1"]), Pool("decode", [URL]), "m", ReleaseMetrics(registry), 1)
    return Retention(table, releaser, Pool("decode", [URL]), high, target, BLOCK, registry), table, dropped


def put(table: HandleTable, cid: str, received: float, tokens: int) -> None:
    params = {"remote_request_id": f"{cid}-{received}", "remote_num_tokens": tokens}
    table.put(Handle(cid, params, URL, None, received, received + 1000))


def kv(usage: float, waiting: int = 0, capacity: int | None = 1000 * BLOCK) -> DecodeKv:
    return DecodeKv(usage, waiting, capacity, 0.0)


def test_under_the_marks_nothing_goes_and_above_them_the_least_valuable_go_first() -> None:
    retention, table, dropped = setup()
    put(table, "old-continued", 1.0, 160)
    table.take("old-continued")
    table.release("old-continued")
    put(table, "old-continued", 2.0, 320)  # took a second turn
    put(table, "once-old", 3.0, 160)
    put(table, "once-new-long", 4.0, 480)
    put(table, "once-new-short", 4.0, 16)
    assert retention.judge(URL, kv(0.85)) == 0  # between the marks, nobody waiting
    assert retention.judge(URL, kv(0.5, waiting=3)) == 0  # waiting with KV to spare: a compute queue
    assert dropped == []
    # 0.81 -> 0.80 of 16000 tokens: 160 to free, the oldest never-continued conversation is enough
    assert retention.judge(URL, kv(0.81, waiting=1)) == 1
    assert dropped == [("once-old", "pressure")]
    # 0.95 -> 0.80: 2400 tokens, more than every never-continued handle; at equal age the shorter goes first
    assert retention.judge(URL, kv(0.95)) == 3
    assert [cid for cid, _ in dropped[1:]] == ["once-new-short", "once-new-long", "old-continued"]
    assert table.take("once-old").reason == "released"


def test_while_requests_wait_for_kv_a_conversation_that_never_continued_is_not_kept() -> None:
    state = RouterState.create(RouterConfig(prefill=("http://p:1",), decode=(URL,)))
    d, table, retention = state.decode.members[0], state.handles, state.retention

    def answered(cid: str, tokens: int) -> None:  # the decode answered a turn of `cid` (turn/keep.py)
        ctx = RequestContext(f"r-{cid}", 0.0, "POST", CHAT, [], b"", None, {}, conversation=cid)
        capture = Capture(chat=True, keep_ids=False)
        capture.params = {"remote_request_id": f"{cid}-{tokens}", "remote_num_tokens": tokens}
        new_handle(state, ctx, capture, d)

    answered("continues", 160)
    table.take("continues")
    table.release("continues")
    retention.judge(URL, DecodeKv(0.85, 2, 1000 * BLOCK, time.monotonic()))  # 2 waiting, above the target
    assert retention.squeezed(URL)
    answered("first-turn", 160)  # released as the decode answers, where a poll would batch it
    assert table.get("first-turn") is None
    assert table.take("first-turn").reason == "released"  # its next turn misses, and is kept from then on
    answered("first-turn", 320)
    answered("continues", 320)  # a conversation that took a second turn is kept
    assert len(table) == 2
    retention.judge(URL, DecodeKv(0.85, 0, 1000 * BLOCK, time.monotonic()))  # nobody waiting: kept again
    assert not retention.squeezed(URL)
    answered("new", 160)
    assert len(table) == 3
    # A finding that old (the decode stopped answering polls) no longer counts.
    retention.judge(URL, DecodeKv(0.85, 2, 1000 * BLOCK, time.monotonic() - 10 * POLL_S))
    assert not retention.squeezed(URL)


def test_without_a_capacity_a_batch_goes_per_poll() -> None:
    retention, table, dropped = setup()
    for i in range(20):
        put(table, f"c{i}", float(i), 160)
    assert retention.judge(URL, kv(0.99, capacity=None)) == 8
    assert [cid for cid, _ in dropped] == [f"c{i}" for i in range(8)]


def test_off_at_a_high_mark_of_zero() -> None:
    retention, table, dropped = setup(high=0.0)
    put(table, "c", 1.0, 160)
    assert retention.judge(URL, kv(1.0, waiting=5)) == 0 and dropped == []


def test_what_the_router_reads_of_a_decodes_metrics() -> None:
    text = ('vllm:gpu_cache_usage_perc{engine="0"} 0.25\nvllm:gpu_cache_usage_perc{engine="1"} 0.5\n'
            'vllm:num_requests_waiting{engine="0"} 2.0\nvllm:num_requests_waiting{engine="1"} 1.0\n'
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n')
    seen = read_decode_kv(text, 1.0)
    assert (seen.usage, seen.waiting, seen.capacity) == (0.5, 3, 1600)
    assert read_decode_kv('vllm:kv_cache_usage_perc{engine="0"} 0.75\n', 1.0).usage == 0.75
    assert read_decode_kv("# nothing\n", 1.0).usage is None


def test_the_single_turn_header() -> None:
    assert single_turn([(b"x-pd-retain", b"No")])
    assert single_turn([(b"x-pd-retain", b" false ")])
    assert not single_turn([(b"x-pd-retain", b"yes")])
    assert not single_turn([(b"x-other", b"no")])

