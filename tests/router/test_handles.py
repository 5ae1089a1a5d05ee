from __future__ import annotations

from array import array

from pdctl.router.kv.conversation import DerivedIndex
from pdctl.router.kv.handles import IN_USE, NEW_CONVERSATION, Handle, HandleTable


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def handle(cid: str, clock: Clock, life: float = 10.0, key: tuple | None = None) -> Handle:
    return Handle(cid, {"remote_num_tokens": 3, "remote_blocks_expiry_time": 1.0}, "http://d0", array("i", [1, 2, 3]),
                  clock(), clock() + life, key)


def test_take_is_single_use_and_concurrent_turns_never_share() -> None:
    clock = Clock()
    table = HandleTable(8, clock)
    table.put(handle("c", clock))
    first = table.take("c")
    assert first.handle is not None and first.eligible
    second = table.take("c")
    assert second.handle is None and second.reason == IN_USE and second.eligible
    table.release("c")
    assert table.take("c").reason == "previous_turn_failed"


def test_new_handle_clears_the_reason_and_replaces_the_old_one() -> None:
    clock = Clock()
    table = HandleTable(8, clock)
    table.put(handle("c", clock))
    table.take("c")
    table.put(handle("c", clock))
    table.release("c")
    assert len(table) == 1 and table.take("c").handle is not None


def test_expiry_uses_the_router_clock_not_the_decode_clock() -> None:
    clock = Clock()
    table = HandleTable(8, clock)
    table.put(handle("c", clock, life=10))  # remote_blocks_expiry_time=1.0 is D's clock: ignored
    clock.now += 9.9
    assert table.get("c") is not None
    clock.now += 0.2
    taken = table.take("c")
    assert taken.handle is None and taken.reason == "expired" and taken.eligible


def test_sweep_drops_expired_handles_without_being_asked_for_them() -> None:
    clock = Clock()
    index = DerivedIndex()
    table = HandleTable(8, clock, index=index)
    table.put(handle("old", clock, life=5, key=("c", 1)))
    table.put(handle("young", clock, life=50, key=("c", 2)))
    clock.now += 6
    assert table.sweep() == 1
    assert len(table) == 1 and len(index) == 1
    assert table.take("old").reason == "expired"


def test_lru_bound_evicts_the_least_recent_and_says_so() -> None:
    clock = Clock()
    table = HandleTable(2, clock)
    for cid in ("a", "b", "c"):
        table.put(handle(cid, clock))
    assert len(table) == 2
    assert table.take("a").reason == "evicted"
    assert table.take("never").reason == NEW_CONVERSATION
    assert not table.take("never").eligible


def test_index_follows_the_table() -> None:
    clock = Clock()
    index = DerivedIndex()
    table = HandleTable(8, clock, index=index)
    table.put(handle("c", clock, key=("c", 42)))
    assert len(index) == 1
    table.take("c")
    assert len(index) == 0


def test_a_handle_whose_decode_may_have_died_is_dropped_unused() -> None:
    from pdctl.router.kv.handles import RESTARTED

    table = HandleTable(8, clock=lambda: 0.0)
    table.put(Handle("c1", {"remote_num_tokens": 16}, "http://d", None, 0.0, 100.0, generation=1))
    table.put(Handle("c2", {"remote_num_tokens": 16}, "http://d", None, 0.0, 100.0, generation=1))
    taken = table.take("c1", stale=lambda h: h.generation != 2)
    assert (taken.handle, taken.reason) == (None, RESTARTED)
    assert table.take("c1").reason == RESTARTED  # the next turn's miss says why too
    assert table.sweep(stale=lambda h: True) == 1 and len(table) == 0


def pinning(cid: str, tokens: int, decode: str = "http://d0", rid: str | None = None) -> Handle:
    return Handle(cid, {"remote_num_tokens": tokens, "remote_request_id": rid or f"req-{cid}-{tokens}"}, decode,
                  None, 0.0, 1000.0)


def test_the_table_counts_pinned_tokens_per_decode_in_whole_blocks() -> None:
    table = HandleTable(8, clock=lambda: 0.0, block_size=16)
    table.put(pinning("a", 17))
    table.put(pinning("b", 16, "http://d1"))
    assert table.pinned() == {"http://d0": 32, "http://d1": 16}
    table.take("a")
    assert table.pinned() == {"http://d1": 16}


def test_every_handle_dropped_unread_is_reported_with_why() -> None:
    from pdctl.router.kv.handles import REPLACED

    clock = Clock()
    dropped: list[tuple[str, str]] = []
    table = HandleTable(2, clock, on_drop=lambda h, why: dropped.append((h.conversation, why)))
    table.put(pinning("a", 16, rid="r1"))
    table.put(pinning("a", 32, rid="r2"))  # a newer handle of the same conversation
    table.put(pinning("a", 32, rid="r2"))  # the same one put back (a local turn): not a drop
    table.put(pinning("b", 16))
    table.put(pinning("c", 16))  # the table holds 2
    table.put(Handle("d", {"remote_num_tokens": 16}, "http://d0", None, clock(), clock() + 1))
    clock.now += 2
    table.take("d")
    table.put(Handle("e", {"remote_num_tokens": 16}, "http://d0", None, clock(), clock() + 1))
    clock.now += 2
    table.sweep()
    table.put(pinning("f", 16))
    assert table.take("f").handle is not None  # taken by a turn: not dropped
    assert dropped == [("a", REPLACED), ("a", "evicted"), ("b", "evicted"), ("d", "expired"), ("e", "expired")]


def test_a_decode_over_its_budget_releases_its_least_recent_handles() -> None:
    from pdctl.router.kv.handles import PRESSURE

    dropped: list[tuple[str, str]] = []
    table = HandleTable(8, clock=lambda: 0.0, on_drop=lambda h, why: dropped.append((h.conversation, why)),
                        budget=lambda url: 64, block_size=16)
    table.put(pinning("a", 30))
    table.put(pinning("other", 64, "http://d1"))  # another decode's pins count against its own budget
    table.put(pinning("b", 20))
    assert dropped == []
    table.put(pinning("c", 10))  # d0: 32 + 32 + 16 > 64
    assert dropped == [("a", PRESSURE)]
    assert table.pinned() == {"http://d0": 48, "http://d1": 64}
    assert (table.on("http://d0"), table.on("http://d1"), table.on("http://d2")) == (2, 1, 0)
    taken = table.take("a")
    assert (taken.handle, taken.reason, taken.eligible) == (None, "released", True)
    table.put(pinning("huge", 100))  # larger than the budget on its own: it stays, every other handle there goes
    assert dropped[1:] == [("b", PRESSURE), ("c", PRESSURE)]
    assert table.pinned() == {"http://d0": 112, "http://d1": 64}
    table.put(pinning("d", 10))  # and the next one displaces it
    assert dropped[3:] == [("huge", PRESSURE)] and table.pinned() == {"http://d0": 16, "http://d1": 64}
    table.take("d")
    table.drop("other", PRESSURE, "released")
    assert (table.on("http://d0"), table.on("http://d1"), len(table)) == (0, 0, 0)


def chained(cid: str, ids: list[int], rid: str | None = None) -> Handle:
    from pdctl import prefix_check

    return Handle(cid, {"remote_num_tokens": len(ids), "remote_request_id": rid or f"req-{cid}"}, "http://d0",
                  array("i", ids), 0.0, 1000.0, spec=prefix_check.spec(ids, len(ids), 256))


def test_a_prefix_two_handles_share_pins_its_blocks_once() -> None:
    from pdctl.router.kv.handles import PRESSURE

    system = list(range(512))  # two whole 256-token chunks every conversation starts with
    dropped: list[tuple[str, str]] = []
    table = HandleTable(8, clock=lambda: 0.0, on_drop=lambda h, why: dropped.append((h.conversation, why)),
                        budget=lambda url: 1536, block_size=256)
    table.put(chained("a", system + [7] * 300))  # 512 shared + 256 + a partial block of 44
    table.put(chained("b", system + [8] * 256))
    assert table.pinned() == {"http://d0": 512 + 512 + 256}
    table.put(chained("c", system + [9] * 300))  # + 512: 1792 > 1536, and releasing a frees its own 512
    assert dropped == [("a", PRESSURE)]
    assert table.pinned() == {"http://d0": 512 + 256 + 512}
    table.take("b")
    table.take("c")
    assert table.pinned() == {}  # the shared chunks went with the last handle that held them
