"""The warm-turn placement rule: the size limit, then (policies load, work) the decode's and the prefill's load."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message

from pdctl.errors import UsageError
from pdctl.router.config import RouterConfig
from pdctl.router.turn.placement import HOP_TOKENS, prompt_tokens, run_locally
from pdctl.router.upstream.load import Load, Work, done_at_first_body
from pdctl.router.upstream.pools import Upstream


def test_the_size_limit_comes_first() -> None:
    assert not run_locally("always", 5000, 4096, Load(0), Load(0), 4)
    assert not run_locally("load", 10, 0, Load(0), Load(0), 4)  # conditional disaggregation off
    assert run_locally("always", 4096, 4096, Load(50), Load(0), 4)  # always: load is not looked at


def test_load_runs_locally_while_the_decode_is_not_busy() -> None:
    assert run_locally("load", 1000, 4096, Load(3), Load(0), 4)


def test_load_sends_the_turn_to_an_idle_prefill_when_the_decode_is_busy() -> None:
    assert not run_locally("load", 1000, 4096, Load(4), Load(0), 4)
    assert not run_locally("load", 1000, 4096, Load(12), Load(0), 4)


def test_load_sends_the_turn_to_a_prefill_with_fewer_in_flight_than_the_busy_decode() -> None:
    assert not run_locally("load", 1000, 4096, Load(6), Load(1), 4)
    assert not run_locally("load", 1000, 4096, Load(6), Load(5), 4)


def test_load_keeps_it_local_when_the_prefill_is_as_busy() -> None:
    assert run_locally("load", 1000, 4096, Load(6), Load(6), 4)
    assert run_locally("load", 1000, 4096, Load(6), None, 4)  # no prefill to compare with


def test_the_router_refuses_an_unknown_policy() -> None:
    with pytest.raises(UsageError) as e:
        RouterConfig(prefill=("http://p",), decode=("http://d",), local_policy="sometimes",  # type: ignore[arg-type]
                     local_busy_streams=0)
    assert e.value.message == ("invalid router options: --local-policy must be one of always, load, work, cost, got "
                               "'sometimes'; --local-busy-streams must be >= 1, got 0")


def test_work_runs_on_an_idle_decode_whatever_the_prefill_does() -> None:
    assert run_locally("work", 4000, 4096, Load(0, 0), Load(0, 0), 4)
    assert run_locally("work", 4000, 4096, Load(30, 0), Load(0, 0), 4)  # many streams, no prompt work: local
    assert not run_locally("work", 5000, 4096, Load(0, 0), Load(0, 0), 4)  # the size limit still comes first


def test_work_sends_the_turn_to_a_prefill_with_less_prompt_work_queued() -> None:
    assert run_locally("work", 800, 4096, Load(3, HOP_TOKENS), Load(0, 0), 4)  # the hop's cost: a tie stays local
    assert not run_locally("work", 800, 4096, Load(3, HOP_TOKENS + 1), Load(0, 0), 4)
    assert not run_locally("work", 800, 4096, Load(1, 3000), Load(1, 2000), 4)


def test_work_keeps_the_turn_local_while_the_prefill_computes_cold_prompts() -> None:
    assert run_locally("work", 800, 4096, Load(5, 3000), Load(2, 12000), 4)
    assert run_locally("work", 800, 4096, Load(5, 3000), None, 4)  # no prefill to compare with


def test_prompt_tokens_counts_ids_and_estimates_text() -> None:
    assert prompt_tokens({"prompt": [1, 2, 3]}) == 3
    assert prompt_tokens({"prompt": "x" * 400}) == 100
    assert prompt_tokens({"messages": [{"role": "system", "content": "x" * 80},
                                       {"role": "user", "content": [{"type": "text", "text": "y" * 40}]}]}) == 30
    assert prompt_tokens({}) == 0


def test_work_is_counted_until_the_first_body_bytes() -> None:
    u = Upstream("http://d", "decode")
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def main() -> None:
        work = Work(u, 700)
        wrapped = done_at_first_body(work, send)
        await wrapped({"type": "http.response.start", "status": 200, "headers": []})
        assert u.work == 700  # headers only: the prompt is not computed yet
        await wrapped({"type": "http.response.body", "body": b"data: {}", "more_body": True})
        assert u.work == 0
        await wrapped({"type": "http.response.body", "body": b"", "more_body": False})
        work.done()  # the caller's finally: counted off once
        assert u.work == 0

    asyncio.run(main())
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body"]
    assert Work(u, -5).tokens == 0 and u.work == 0
