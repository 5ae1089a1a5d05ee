"""Overflow to the prefill (router.overflow_kv): a decode short of KV, a turn served whole on a prefill.

The rule is a pure function (first tests). The rest runs a real router and real simulated engines: a decode with a
tiny KV pool filled by long conversations (their handles pin it: --no-release), so the router's poll of its
/metrics sees it above the threshold. Which engine served a turn is read at the engines' own /metrics (the tokens
each generated)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.errors import UsageError
from pdctl.router.config import RouterConfig
from pdctl.router.turn.overflow import whole_on_prefill
from pdctl.router.upstream.pools import Upstream
from tests.router.conftest import RouterProc, assert_clean, router_process
from tests.router.faults import eventually, kill
from tests.router.talk import Reply, send
from tests.support.sim_procs import SERVED, SimProc, sim_process

THRESHOLD = 0.5
BLOCKS = 64  # of 16 tokens; a fill conversation pins 7 of them (the router estimates ~100 tokens: 4 characters each)


def _u(name: str, outstanding: int = 0) -> Upstream:
    return Upstream(f"http://{name}", "prefill", outstanding=outstanding)


def test_rule_overflows_only_past_the_threshold_to_the_least_used_prefill_below_it() -> None:
    a, b, c = _u("a"), _u("b"), _u("c")
    prefills = [(a, 0.4), (b, 0.2), (c, 0.9)]
    assert whole_on_prefill(0.85, 0.9, prefills) is b
    assert whole_on_prefill(0.85, 0.85, prefills) is None  # at the threshold: not above it
    assert whole_on_prefill(0.85, 0.5, prefills) is None
    assert whole_on_prefill(0.85, 0.9, [(c, 0.9), (a, None)]) is None  # no prefill below it (unknown is not)
    assert whole_on_prefill(0.85, None, prefills) is None  # the decode's use unknown
    assert whole_on_prefill(0.0, 0.99, prefills) is None  # off
    assert whole_on_prefill(None, 0.99, prefills) is None
    busy = _u("busy", outstanding=3)
    assert whole_on_prefill(0.85, 0.9, [(busy, 0.2), (a, 0.2)]) is a  # equal use: the less loaded


def test_rule_keeps_a_conversation_on_its_prefill_while_that_prefill_is_below_the_threshold() -> None:
    a, b = _u("a"), _u("b")
    assert whole_on_prefill(0.85, 0.1, [(a, 0.6), (b, 0.1)], current=a) is a  # stays even with a roomy decode
    assert whole_on_prefill(0.85, 0.9, [(a, 0.9), (b, 0.1)], current=a) is b  # its prefill is full: moves
    assert whole_on_prefill(0.85, 0.1, [(a, 0.9), (b, 0.1)], current=a) is None  # ... or back to the decode


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[tuple[SimProc, SimProc]]:
    with (sim_process(tmp_path, "decode", num_blocks=BLOCKS) as d,
          sim_process(tmp_path, "prefill", prefix_caching=True) as p):
        yield p, d


def _chat(router: RouterProc, cid: str, content: str, **extra: Any) -> Reply:
    body = {"model": SERVED, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}
    with httpx.Client(timeout=30) as c:
        return send(c, router.url, body, {"x-conversation-id": cid})


def _words(i: int) -> str:
    return " ".join(f"{chr(97 + i)}{j:02d}" for j in range(90))  # 90 tokens of 3 characters, the first its own


def _fill(router: RouterProc, decode: SimProc, overflow: bool = True) -> None:
    """Conversations whose handles pin the decode's KV: with overflow on, until the router serves one whole on a
    prefill (the decode's use with that turn is past THRESHOLD); off, 6 of them (42 of the 64 blocks)."""
    for i in range(20 if overflow else 6):
        reply = _chat(router, f"fill-{i}-{uuid.uuid4().hex}", _words(i))
        assert reply.status == 200
        if reply.reason == "whole_prefill":
            break
    else:
        assert not overflow, "the decode never overflowed"
    assert decode.metric("vllm:kv_cache_usage_perc") > 0.3


def _generated(*sims: SimProc) -> list[float]:
    return [s.metric("vllm:generation_tokens_total") for s in sims]


def test_a_new_conversation_on_a_full_decode_runs_whole_on_the_prefill_and_stays_there(
        engines: tuple[SimProc, SimProc], tmp_path: Path) -> None:
    p, d = engines
    with router_process(tmp_path, [p.url], [d.url], "--overflow-kv", str(THRESHOLD), "--no-release") as router:
        _fill(router, d)
        cid = f"new-{uuid.uuid4().hex}"
        before, turns = _generated(p, d), router.stats()["whole_prefill_turns"]
        first = _chat(router, cid, _words(25))
        assert (first.status, first.reuse) == (200, "miss;tokens=0;reason=whole_prefill")
        mid = _generated(p, d)
        assert mid[0] > before[0] and mid[1] == before[1]  # the prefill generated it, the decode nothing
        body = {"model": SERVED, "max_tokens": 4, "stream": True, "messages": [
            {"role": "user", "content": _words(25)}, {"role": "assistant", "content": first.text},
            {"role": "user", "content": "and then"}]}
        with httpx.Client(timeout=30) as c:
            second = send(c, router.url, body, {"x-conversation-id": cid})
        assert (second.status, second.reuse) == (200, "hit;tokens=0;reason=whole_prefill")
        assert second.text
        after = _generated(p, d)
        assert after[0] > mid[0] and after[1] == mid[1]
        stats = router.stats()
        assert stats["whole_prefill_turns"] == turns + 2
        assert stats["reuse_reasons"]["whole_prefill"] == turns + 2
        assert set(stats["kv_use"]) == {p.url, d.url} and stats["kv_use"][d.url] > 0.3
        metrics = httpx.get(f"{router.url}/metrics", timeout=10).text
        assert f"pdctl_router_whole_prefill_turns_total {turns + 2:.1f}" in metrics


def test_every_api_shape_is_served_whole_on_the_prefill(engines: tuple[SimProc, SimProc], tmp_path: Path) -> None:
    p, d = engines
    with (router_process(tmp_path, [p.url], [d.url], "--overflow-kv", str(THRESHOLD), "--no-release") as router,
          httpx.Client(timeout=30) as c):
        _fill(router, d)
        turns = router.stats()["whole_prefill_turns"]
        requests = [
            ("/v1/completions", {"model": SERVED, "prompt": _words(21), "max_tokens": 4}),
            ("/v1/completions", {"model": SERVED, "prompt": _words(22), "max_tokens": 4, "stream": True}),
            ("/v1/responses", {"model": SERVED, "input": _words(23), "max_output_tokens": 4}),
            ("/v1/messages", {"model": SERVED, "max_tokens": 4, "messages": [{"role": "user", "content": _words(24)}]}),
        ]
        for path, body in requests:
            before = _generated(p, d)
            r = c.post(router.url + path, json=body, headers={"x-conversation-id": f"shape-{uuid.uuid4().hex}"})
            assert r.status_code == 200, (path, r.text)
            assert_clean(re.sub(rb'"(kv_transfer_params|prompt_token_ids|token_ids)":null', b"", r.content), r.headers)
            after = _generated(p, d)
            assert after[0] > before[0] and after[1] == before[1], path
        assert router.stats()["whole_prefill_turns"] == turns + len(requests)


def test_with_overflow_off_the_turn_goes_to_the_full_decode(engines: tuple[SimProc, SimProc], tmp_path: Path) -> None:
    p, d = engines
    with router_process(tmp_path, [p.url], [d.url], "--overflow-kv", "0", "--no-release") as router:
        _fill(router, d, overflow=False)
        assert eventually(lambda: router.stats()["kv_use"] == {}, within=2)  # off: the router polls nothing
        assert d.metric("vllm:kv_cache_usage_perc") > THRESHOLD
        before = _generated(p, d)
        reply = _chat(router, f"new-{uuid.uuid4().hex}", _words(25))
        assert (reply.status, reply.reuse) == (200, "miss;tokens=0;reason=new_conversation")
        after = _generated(p, d)
        assert after[1] > before[1]
        assert router.stats()["whole_prefill_turns"] == 0


def test_a_dead_prefill_falls_back_to_the_decode(tmp_path: Path) -> None:
    with (sim_process(tmp_path, "decode", num_blocks=BLOCKS) as d,
          sim_process(tmp_path, "prefill", name="dies", prefix_caching=True) as dies,
          sim_process(tmp_path, "prefill", name="lives", prefix_caching=True) as lives,
          router_process(tmp_path, [dies.url, lives.url], [d.url], "--overflow-kv", str(THRESHOLD), "--no-release",
                         "--health-interval", "600", "--eject-after", "100") as router):
        _fill(router, d)
        cid = f"new-{uuid.uuid4().hex}"
        before = _generated(dies, lives, d)
        assert _chat(router, cid, _words(25)).reuse == "miss;tokens=0;reason=whole_prefill"
        served = [a > b for a, b in zip(_generated(dies, lives, d), before, strict=True)]
        assert served.count(True) == 1 and not served[2]
        holder = dies if served[0] else lives
        kill(holder)  # the pool still counts it healthy (no health check for 600 s): the turn tries it first
        before = _generated(d)
        body = {"model": SERVED, "max_tokens": 4, "messages": [{"role": "user", "content": _words(25)},
                {"role": "assistant", "content": "x"}, {"role": "user", "content": "again"}]}
        with httpx.Client(timeout=30) as c:
            reply = send(c, router.url, body, {"x-conversation-id": cid})
        assert reply.status == 200
        assert "whole_prefill" not in reply.reuse
        assert _generated(d)[0] > before[0]
        assert "could not serve the turn whole; through the decode instead" in router.log_text()


def test_the_threshold_must_be_a_fraction() -> None:
    with pytest.raises(UsageError, match=r"--overflow-kv must be between 0 and 1, got 1\.5"):
        RouterConfig(prefill=("http://p",), decode=("http://d",), overflow_kv=1.5)
