"""The kept responses behind previous_response_id: expiry by the router's clock, bounded entries and bytes."""

from __future__ import annotations

from pdctl.router.kv.response_store import ResponseStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_response_lives_as_long_as_a_handle() -> None:
    clock = Clock()
    store = ResponseStore(lifetime=30, max_entries=10, clock=clock)
    store.put("resp_a", [{"role": "user", "content": "hi"}], "d:1", "alice")
    clock.now += 29.9
    kept = store.get("resp_a", "alice")
    assert kept is not None and kept.conversation == "d:1" and kept.history[0]["content"] == "hi"
    clock.now += 0.1
    assert store.get("resp_a", "alice") is None and len(store) == 0 and store.size == 0
    assert store.get("resp_never", "alice") is None


def test_entries_and_bytes_are_bounded_least_recently_used_first() -> None:
    store = ResponseStore(lifetime=30, max_entries=2, clock=Clock())
    for rid in ("a", "b", "c"):
        store.put(rid, [{"content": rid}], None, "")
    assert store.get("a", "") is None and store.get("b", "") is not None and len(store) == 2
    small = ResponseStore(lifetime=30, max_entries=100, max_bytes=100, clock=Clock())
    small.put("x", [{"content": "x" * 40}], None, "")
    small.get("x", "")
    small.put("y", [{"content": "y" * 40}], None, "")
    assert small.get("x", "") is None and small.get("y", "") is not None and small.size <= 100
    small.put("huge", [{"content": "z" * 200}], None, "")  # larger than the whole bound: not kept, nothing evicted
    assert small.get("huge", "") is None and small.get("y", "") is not None


def test_another_owners_response_is_unknown_to_them() -> None:
    store = ResponseStore(lifetime=30, max_entries=10, clock=Clock())
    store.put("resp_a", [{"role": "user", "content": "secret plan"}], "d:1", "alice")
    assert store.get("resp_a", "mallory") is None
    kept = store.get("resp_a", "alice")  # the stranger's try neither spent nor expired it
    assert kept is not None and kept.history[0]["content"] == "secret plan"
