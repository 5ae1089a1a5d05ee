"""The one thread pool: results by item in order, and every item done before the first error is raised."""

from __future__ import annotations

import threading

import pytest

from pdctl.errors import LaunchError
from pdctl.remote.fanout import parallel


def test_results_come_back_by_item_in_the_items_order() -> None:
    assert list(parallel(["c", "a", "b"], str.upper).items()) == [("c", "C"), ("a", "A"), ("b", "B")]
    assert parallel([], str.upper) == {}


def test_items_run_at_once() -> None:
    barrier = threading.Barrier(3, timeout=30)
    assert parallel([1, 2, 3], lambda n: barrier.wait() >= 0) == {1: True, 2: True, 3: True}


def test_every_item_finishes_before_the_first_error_names_the_others() -> None:
    done: list[str] = []

    def one(name: str) -> str:
        if name != "ok":
            raise LaunchError(f"{name} failed\nits log", hint="fix it")
        done.append(name)
        return name

    with pytest.raises(LaunchError) as err:
        parallel(["a", "ok", "b", "c"], one)
    assert done == ["ok"]
    assert err.value.message == "a failed\nits log\n(also: b failed; c failed)"
