"""Multi-turn conversations through a real router in front of real simulator processes."""

from __future__ import annotations

import uuid

import pytest

from pdctl.prefix_check import chunk_tokens
from tests.router.conftest import BLOCK, RouterProc, assert_clean, corrupt
from tests.router.talk import Conversation
from tests.support.sim_procs import SimPair

MODES = ("body", "header", "derived")


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("mode", MODES)
def test_turns_after_the_first_reuse_the_decode_kv(router: RouterProc, pd: SimPair, chat: bool, stream: bool,
                                                   mode: str) -> None:
    conv = Conversation(router.url, chat, stream, mode, uuid.uuid4().hex)
    first = conv.turn(f"{uuid.uuid4().hex} tell me about the sea and the sky and the long road home")
    assert first.status == 200 and first.text
    assert (first.outcome, first.reason) == ("miss", "new_conversation")
    assert first.headers["x-request-id"] and float(first.headers["x-pd-prefill-ms"]) >= 0
    assert_clean(first.raw, first.headers)
    for n in range(2, 5):
        reply = conv.turn(f"and what happened on day {n}?")
        assert reply.status == 200 and reply.text
        assert (reply.outcome, reply.reason) == ("hit", "verified"), reply.reuse
        assert int(reply.reuse.split("tokens=")[1].split(";")[0]) > 0
        assert_clean(reply.raw, reply.headers)
    assert corrupt(pd.prefill, pd.decode) == 0


def test_an_edited_history_is_never_reused_wrongly(router: RouterProc, pd: SimPair) -> None:
    conv = Conversation(router.url, True, True, "body", uuid.uuid4().hex)
    conv.turn("a long first question " + "about many things " * 100)  # ~300 tokens: one chunk of the check's
    conv.turn("a second question")
    conv.messages[0]["content"] = "an edited first question " + "about many things " * 100  # the client rewrote it
    reply = conv.turn("a third question")
    assert reply.status == 200 and reply.text
    assert (reply.outcome, reply.reason) == ("miss", "prefix_diverged")
    conv.messages[-2]["content"] = "a 3rd question"  # an edit late in the history: the chunks before it verify
    reply = conv.turn("a fourth question")
    assert reply.status == 200
    n = chunk_tokens(BLOCK)  # the prefill caches nothing here: all of it read
    assert reply.reuse == f"partial;tokens={n};read={n};block={n // BLOCK};reason=prefix_diverged"
    assert corrupt(pd.prefill, pd.decode) == 0


def test_a_reasoning_stripped_history_reuses_only_verified_blocks(router: RouterProc, pd: SimPair) -> None:
    conv = Conversation(router.url, True, False, "derived", uuid.uuid4().hex, max_tokens=24,
                        chat_template_kwargs={"enable_thinking": True})
    first = conv.turn("think hard about " + "the question of questions " * 10)
    assert "<think>" in first.text and "</think>" in first.text
    conv.messages[-1]["content"] = first.text.split("</think>", 1)[1].strip()  # as Qwen3's template does
    reply = conv.turn("and now?")
    assert reply.status == 200 and reply.text
    assert reply.outcome in ("partial", "miss") and reply.reason == "prefix_diverged"
    assert corrupt(pd.prefill, pd.decode) == 0


def test_a_retried_turn_is_a_miss(router: RouterProc, pd: SimPair) -> None:
    conv = Conversation(router.url, False, False, "body", uuid.uuid4().hex)
    conv.turn("once upon a time " * 5)
    body = conv.body(" and then")
    first = conv.turn(" and then")
    assert first.outcome == "hit"
    conv.prompt = body["prompt"]  # the client never saw the answer and sends the same turn again
    retry = conv.turn("")
    assert retry.status == 200 and retry.text
    assert (retry.outcome, retry.reason) == ("miss", "prompt_not_longer")
    assert corrupt(pd.prefill, pd.decode) == 0


def test_stats_and_metrics(router: RouterProc) -> None:
    conv = Conversation(router.url, True, True, "body", uuid.uuid4().hex)
    conv.turn("hello")
    conv.turn("again")
    stats = router.stats()
    for key in ("requests_total", "reuse", "reuse_reasons", "reused_tokens_total", "hit_rate", "live_handles",
                "prefill", "decode", "uptime_s", "version"):
        assert key in stats
    assert stats["reuse"]["hit"] >= 1 and 0 < stats["hit_rate"] <= 1 and stats["live_handles"] >= 1
    assert set(stats["prefill"][0]) == {"url", "healthy", "outstanding", "work", "failures", "generation", "draining",
                                       "held"}
    text = conv.client.get(router.url + "/metrics").text
    for series in ("pdctl_router_requests_total", "pdctl_router_kv_reuse_total", "pdctl_router_reused_tokens_total",
                   "pdctl_router_prefill_duration_seconds_bucket", "pdctl_router_ttft_seconds_bucket",
                   "pdctl_router_live_handles"):
        assert series in text
    assert 'outcome="hit",reason="verified"' in text
    assert "Prefill done in" in router.log_text()
    health = conv.client.get(router.url + "/health").json()
    assert health["status"] == "ok" and health["prefill"] == {"healthy": 1, "total": 1}
