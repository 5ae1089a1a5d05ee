"""The warm-turn placement rule: the size limit, then (policy load) the decode's and the prefill's load."""

from __future__ import annotations

import pytest

from pdctl.errors import UsageError
from pdctl.router.config import RouterConfig
from pdctl.router.placement import Load, run_locally


def test_the_size_limit_comes_first() -> None:
    assert not run_locally("always", 5000, 4096, Load(0), Load(0), 4)
    assert not run_locally("load", 10, 0, Load(0), Load(0), 4)  # conditional disaggregation off
    assert run_locally("always", 4096, 4096, Load(50), Load(0), 4)  # always: load is not looked at


def test_load_runs_locally_while_the_decode_is_not_busy() -> None:
    assert run_locally("load", 1000, 4096, Load(3), Load(0), 4)


def test_load_sends_the_turn_to_an_idle_prefill_when_the_decode_is_busy() -> None:
    assert not run_locally("load", 1000, 4096, Load(4), Load(0), 4)
    assert not run_locally("load", 1000, 4096, Load(12), Load(0), 4)


def test_load_keeps_it_local_when_the_prefill_is_busy_too() -> None:
    assert run_locally("load", 1000, 4096, Load(6), Load(1), 4)
    assert run_locally("load", 1000, 4096, Load(6), None, 4)  # no prefill to compare with


def test_the_router_refuses_an_unknown_policy() -> None:
    with pytest.raises(UsageError) as e:
        RouterConfig(prefill=("http://p",), decode=("http://d",), local_policy="sometimes",  # type: ignore[arg-type]
                     local_busy_streams=0)
    assert e.value.message == ("invalid router options: --local-policy must be one of always, load, got "
                               "'sometimes'; --local-busy-streams must be >= 1, got 0")
