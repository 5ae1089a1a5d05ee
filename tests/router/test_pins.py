from __future__ import annotations

from pdctl.router.pins import over_budget, pinned_tokens


def test_a_handle_pins_whole_blocks() -> None:
    assert [pinned_tokens(n, 16) for n in (0, 1, 16, 17, 32)] == [0, 16, 16, 32, 32]
    assert pinned_tokens(-5, 16) == 0


def test_over_budget_releases_the_least_recent_until_under() -> None:
    lru = [("a", 100), ("b", 50), ("c", 70)]
    assert over_budget(lru, 300, 200) == ["a"]
    assert over_budget(lru, 300, 150) == ["a", "b"]
    assert over_budget(lru, 300, 300) == []


def test_no_budget_releases_nothing() -> None:
    assert over_budget([("a", 100)], 10**9, 0) == []


def test_a_newest_handle_larger_than_the_budget_leaves_alone() -> None:
    # The newest (not in `lru`) holds 500 of a 200 budget: everything else goes, it stays.
    assert over_budget([("a", 10), ("b", 20)], 530, 200) == ["a", "b"]
