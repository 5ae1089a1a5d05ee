"""Counters that tell the truth. A D->P read of N tokens moves N (not the tokens reused); a warm turn with
bidirectional off whose prefill's own cache served part of the prompt is `prefill_cache`, with a session header
or without one alike; a conversation replayed from its first turn is a new conversation, not a missed warm turn;
/stats gives the hit rate since start and over a recent window, with the counts. Real simulators and router."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import httpx

from pdctl.router.wire import KV_SOURCES, REUSE_PAIRS, Reuse
from tests.router.conftest import SPEED, RouterProc, corrupt, router_process
from tests.router.faults import eventually
from tests.support.sim_procs import sim_pair

DETAILS = ["--enable-prompt-tokens-details"]
HISTORY = " ".join(f"c{i}" for i in range(300))


def _metric(router: RouterProc, name: str, labels: str = "") -> float:
    text = httpx.get(f"{router.url}/metrics", timeout=10).text
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.M)
    return sum(float(v) for lab, v in pattern.findall(text) if labels in lab)


def _turn(router: RouterProc, messages: list[dict[str, Any]], cid: str | None) -> tuple[dict[str, Any], Reuse]:
    headers = {"X-Session-ID": cid} if cid else {}
    resp = httpx.post(f"{router.url}/v1/chat/completions", headers=headers, timeout=30,
                      json={"model": "Qwen", "messages": messages, "max_tokens": 8})
    assert resp.status_code == 200, resp.text
    return resp.json(), Reuse.parse(resp.headers.get("x-pd-kv-reuse"))


def _conversation(router: RouterProc, cid: str | None, turns: int, first: str = "") -> list[Reuse]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": first or f"{uuid.uuid4().hex} {HISTORY}"}]
    out = []
    for t in range(turns):
        body, reuse = _turn(router, messages, cid)
        out.append(reuse)
        messages += [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"turn {t + 2}"}]
    return out


def test_d_to_p_moved_counts_the_tokens_read(tmp_path: Path) -> None:
    """The prefill's own cache holds the history but the reply: it reads only the reply, and that is what moved."""
    with (
        sim_pair(tmp_path, speed=SPEED, prefill_kwargs={"prefix_caching": True}) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url]) as router,
    ):
        reuses = _conversation(router, uuid.uuid4().hex, 3)
        warm = reuses[1:]
        assert all(r.outcome == "hit" and r.read is not None and 0 < r.read < r.tokens for r in warm), warm
        moved = _metric(router, "pdctl_router_kv_moved_tokens_sum", 'direction="d_to_p"')
        assert moved == sum(r.read or 0 for r in warm) < sum(r.tokens for r in warm)
        assert _metric(router, "pdctl_router_kv_moved_tokens_count", 'direction="d_to_p"') == 3
        assert corrupt(pd.prefill, pd.decode) == 0


def test_off_warm_turns_served_by_the_prefill_cache_are_counted_so_whatever_the_client_sends(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=SPEED, bidirectional=False, prefill_kwargs={"prefix_caching": True},
                 prefill_args=DETAILS, decode_args=DETAILS) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url]) as router,
    ):
        with_header = _conversation(router, uuid.uuid4().hex, 3)
        without = _conversation(router, None, 3)
        for reuses in (with_header, without):
            assert reuses[0].reason == "new_conversation" and reuses[0].source == "recomputed"
            for r in reuses[1:]:
                assert (r.outcome, r.reason, r.source) == ("miss", "no_handle_returned", "prefill_cache"), r
                assert r.cached is not None and r.cached > 300
        assert _metric(router, "pdctl_router_turn_kv_source_total", 'source="prefill_cache"') == 4
        assert _metric(router, "pdctl_router_turn_kv_source_total", 'source="recomputed"') == 2
        stats = router.stats()
        assert stats["eligible_turns"] == 4 and stats["reuse_reasons"]["no_handle_returned"] == 4
        assert stats["hit_rate"] == 0.0 and stats["recent_eligible_turns"] == 4


def test_a_replayed_conversation_is_a_new_one_and_stats_have_a_recent_window(tmp_path: Path) -> None:
    """A trace replayed against the same router (same session id, same first message): turn 1 again is a new
    conversation (the old handle released), and the replay's turn 2 hits as the first run's did."""
    with (
        sim_pair(tmp_path, speed=SPEED) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url]) as router,
    ):
        cid, first = uuid.uuid4().hex, f"{uuid.uuid4().hex} {HISTORY}"
        run1 = _conversation(router, cid, 2, first)
        run2 = _conversation(router, cid, 2, first)
        for run in (run1, run2):
            assert [(r.outcome, r.reason) for r in run] == [("miss", "new_conversation"), ("hit", "verified")], run
        stats = router.stats()
        assert stats["eligible_turns"] == 2 and stats["reused_turns"] == 2 and stats["hit_rate"] == 1.0
        assert stats["recent_window_s"] == 60.0
        assert (stats["recent_eligible_turns"], stats["recent_reused_turns"], stats["recent_hit_rate"]) == (2, 2, 1.0)
        # the first run's last handle, released on the replay (after --release-carry-ms, when no turn carried it)
        assert eventually(lambda: router.stats()["releases"].get("restarted") == 1), router.stats()["releases"]
        assert corrupt(pd.prefill, pd.decode) == 0


def test_reuse_series_are_exported_at_zero_before_the_first_turn(tmp_path: Path) -> None:
    """A fresh (or restarted) router exports every outcome and reason at 0: a dashboard's hit rate has a hit series
    while there have been only misses, and a rate sees the first hit as 0 -> 1."""
    with (
        sim_pair(tmp_path, speed=SPEED) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url]) as router,
    ):
        text = httpx.get(f"{router.url}/metrics", timeout=10).text
        reuse = re.findall(r'^pdctl_router_kv_reuse_total\{outcome="(\w+)",reason="(\w+)"\} 0\.0$', text, re.M)
        assert set(reuse) == set(REUSE_PAIRS)
        assert {("hit", "verified"), ("partial", "prefix_diverged"), ("miss", "new_conversation"),
                ("hit", "decode_local"), ("miss", "released")} <= set(reuse)
        for source in KV_SOURCES:
            assert f'pdctl_router_turn_kv_source_total{{source="{source}"}} 0.0' in text

        _conversation(router, uuid.uuid4().hex, 1)  # a first turn: a miss, and still a hit series at 0
        assert _metric(router, "pdctl_router_kv_reuse_total", 'outcome="miss",reason="new_conversation"') == 1
        after = httpx.get(f"{router.url}/metrics", timeout=10).text
        assert 'pdctl_router_kv_reuse_total{outcome="hit",reason="verified"} 0.0' in after
