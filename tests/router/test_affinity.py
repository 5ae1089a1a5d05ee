"""Aggregated mode's choice of engine (pdctl.router.affinity), on its pure parts: the conversation table and the
pick among the pool's instances."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.errors import UsageError
from pdctl.router.config import RouterConfig
from pdctl.router.kv.affinity import AffinityTable, EngineChoice, Served
from pdctl.router.kv.conversation import DerivedIndex
from pdctl.router.upstream.pools import Pool


def pool() -> Pool:
    return Pool("decode", ["http://a", "http://b", "http://c"])


def test_the_engine_that_served_the_last_turn_is_kept_while_healthy_and_the_same_process() -> None:
    p, choice = pool(), EngineChoice()
    a, b, c = p.members
    a.outstanding = 5  # busier than the others: affinity wins over load (its prefix cache holds the conversation)
    last = Served(a.url, a.generation)
    assert choice.pick(p, last) is a
    p.lost(a)  # it may have restarted: its cache is gone, so the least loaded instead
    assert choice.pick(p, last) in (b, c)
    assert choice.pick(p, Served(b.url, b.generation), exclude=[b]) in (a, c)
    b.healthy = False
    assert choice.pick(p, Served(b.url, b.generation)) in (a, c)


def test_a_new_conversation_goes_to_the_fewest_requests_then_the_fewest_prompt_tokens() -> None:
    p, choice = pool(), EngineChoice()
    a, b, c = p.members
    a.outstanding, b.outstanding, c.outstanding = 2, 1, 1
    b.work, c.work = 5000, 300
    assert [choice.pick(p, None) for _ in range(3)] == [c, c, c]
    c.work = 5000
    assert {choice.pick(p, None) for _ in range(4)} == {b, c}  # a tie rotates
    assert choice.pick(p, None, exclude=[b, c]) is a
    assert choice.pick(p, None, exclude=p.members) is None


def test_the_table_is_bounded_and_keeps_derived_keys_in_the_index() -> None:
    index = DerivedIndex()
    table = AffinityTable(2, index=index)
    a, b, _ = pool().members
    key: Hashable = ("c", 1)
    table.put("one", a, key)
    assert index._chat == {1: "one"}
    table.put("one", b)  # a turn without a new key keeps the old one
    assert table.get("one") == Served(b.url, 0, key) and index._chat == {1: "one"}
    table.put("one", b, ("c", 2))
    assert index._chat == {2: "one"}
    table.put("two", a)
    table.put("three", a)
    assert table.get("one") is None and len(table) == 2 and index._chat == {}  # the oldest went, with its key


def test_aggregated_router_options_are_checked() -> None:
    with pytest.raises(UsageError) as e:
        RouterConfig(prefill=("http://p",), decode=("http://d",), mode="aggregated")
    assert e.value.message == ("invalid router options: --mode aggregated takes no --prefill URL (every --decode "
                               "is a whole engine)")
    with pytest.raises(UsageError) as e:
        RouterConfig(decode=(), mode="aggregated")
    assert e.value.message == "invalid router options: at least one --decode URL is needed"
    with pytest.raises(UsageError) as e:
        RouterConfig(decode=("http://d",), mode="both")  # type: ignore[arg-type]
    assert e.value.message == ("invalid router options: --mode must be disaggregated or aggregated, got 'both'; "
                               "at least one --prefill URL is needed")
    assert RouterConfig(decode=("http://d", "http://e"), mode="aggregated").decode == ("http://d", "http://e")
    with pytest.raises(UsageError) as e:
        RouterConfig(decode=("http://d",))
    assert e.value.message == "invalid router options: at least one --prefill URL is needed"


def test_router_serve_refuses_a_prefill_in_aggregated_mode_in_one_line() -> None:
    args = ["router", "serve", "--mode", "aggregated", "--prefill", "http://p", "--decode", "http://d"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "Error: invalid router options: --mode aggregated takes no --prefill URL (every --decode is a whole engine)",
        "hint: see `pdctl router serve --help`",
    ]
