"""Faults the router must absorb: expired handles, failing KV reads, dead engines, racing turns; and affinity."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.router.conftest import SPEED, RouterProc, corrupt, router_process
from tests.router.faults import eventually, kill
from tests.router.talk import Conversation, Reply
from tests.support.sim_procs import SimPair, sim_pair, sim_process

GEN = "vllm:generation_tokens_total"


def test_expired_handles_are_swept_and_never_sent(pd: SimPair, tmp_path: Path) -> None:
    with router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--handle-ttl", "0.5",
                        "--sweep-interval", "0.1") as router:
        conv = Conversation(router.url, True, False, "body", uuid.uuid4().hex)
        conv.turn("remember this " * 10)
        assert router.stats()["live_handles"] == 1
        deadline = time.monotonic() + 10
        while router.stats()["live_handles"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert router.stats()["live_handles"] == 0  # swept by the timer, no request needed
        reply = conv.turn("still there?")
        assert reply.status == 200 and (reply.outcome, reply.reason) == ("miss", "expired")
        assert router.stats()["hit_rate"] == 0.0  # an expired turn is an eligible turn that missed
    assert corrupt(pd.prefill, pd.decode) == 0


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_a_failing_kv_read_never_reaches_the_client(tmp_path: Path, policy: str) -> None:
    with (
        sim_pair(tmp_path, speed=SPEED, policy=policy, prefill_args=["--fail-kv-reads", "1"]) as pair,
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url]) as router,
    ):
        conv = Conversation(router.url, False, True, "body", uuid.uuid4().hex)
        conv.turn("a prompt long enough to span blocks " * 6)
        reply = conv.turn(" next")
        assert reply.status == 200 and reply.text and not any("error" in e for e in reply.events)
        assert pair.prefill.metric("vllm:nixl_num_failed_transfers_total") == 1
        if policy == "fail":  # the prefill answered an error: the router retried the turn as a miss
            assert (reply.outcome, reply.reason) == ("miss", "prefill_failed")
        else:  # the prefill recomputed on its own and says nothing
            assert reply.outcome == "hit"
        assert conv.turn(" and after").outcome == "hit"
        assert corrupt(pair.prefill, pair.decode) == 0


def test_a_killed_decode_is_routed_around(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=SPEED) as pair,
        sim_process(tmp_path, "decode", name="decode-1", speed=SPEED) as d1,
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url, d1.url]) as router,
    ):
        conv = Conversation(router.url, True, True, "header", uuid.uuid4().hex)
        before = {d.name: d.metric(GEN) for d in (pair.decode, d1)}
        conv.turn("which decode am I on " * 6)
        holder, other = (pair.decode, d1) if pair.decode.metric(GEN) > before["decode"] else (d1, pair.decode)
        kill(holder)
        reply = conv.turn("are you still there?")
        assert reply.status == 200 and reply.text
        assert reply.outcome == "miss"  # the blocks died with their decode; the prefill's read failed
        assert conv.turn("and now?").outcome == "hit"
        assert corrupt(pair.prefill, other) == 0
        want = [d is not holder for d in (pair.decode, d1)]
        assert eventually(lambda: [d["healthy"] for d in router.stats()["decode"]] == want)  # health checks eject


def test_a_decode_dying_mid_stream_ends_the_stream_with_an_error_event(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=20) as pair,
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url]) as router,
        httpx.Client(timeout=30) as client,
    ):
        body = {"model": "Qwen", "prompt": "stream for a while", "max_tokens": 400, "stream": True}
        with client.stream("POST", router.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            kill(pair.decode)
            rest = list(lines)
        assert any('"error"' in line and "mid-stream" in line for line in rest)
        assert rest[-2:] == ["data: [DONE]", ""] or rest[-1] == "data: [DONE]"
        assert router.stats()["decode"][0]["healthy"] is False
        health = client.get(router.url + "/health")
        assert health.status_code == 503 and "no healthy decode" in health.json()["reason"]
        r = client.post(router.url + "/v1/completions", json={**body, "stream": False})
        assert r.status_code == 503 and "no healthy decode instance (0 of 1 healthy)" in r.json()["error"]["message"]


def test_a_killed_prefill_is_routed_around(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=SPEED) as pair,
        sim_process(tmp_path, "prefill", name="prefill-1", speed=SPEED) as p1,
        router_process(tmp_path, [pair.prefill_url, p1.url], [pair.decode_url]) as router,
    ):
        kill(p1)
        replies = [Conversation(router.url, True, False, "body", uuid.uuid4().hex).turn(f"conversation {i}")
                   for i in range(8)]
        assert all(r.status == 200 and r.text for r in replies)
        assert eventually(lambda: router.stats()["prefill"][1]["healthy"] is False)


def test_concurrent_turns_of_one_conversation_never_share_a_handle(router: RouterProc, pd: SimPair) -> None:
    conv = Conversation(router.url, False, True, "body", uuid.uuid4().hex)
    conv.turn("a shared beginning " * 8)
    body = conv.body(" the same next turn")

    def one(_: int) -> Reply:
        from tests.router.talk import send

        return send(httpx.Client(timeout=30), router.url, body)

    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(one, range(6)))
    assert all(r.status == 200 and r.text for r in replies)
    assert sum(r.outcome == "hit" for r in replies) <= 1
    assert {r.reason for r in replies if r.outcome == "miss"} <= {"handle_in_use", "prompt_not_longer"}
    assert corrupt(pd.prefill, pd.decode) == 0


def test_2p2d_keeps_each_conversation_on_one_prefill_and_one_decode(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=SPEED) as pair,
        sim_process(tmp_path, "prefill", name="prefill-1", speed=SPEED) as p1,
        sim_process(tmp_path, "decode", name="decode-1", speed=SPEED) as d1,
        router_process(tmp_path, [pair.prefill_url, p1.url], [pair.decode_url, d1.url]) as router,
    ):
        engines = (pair.prefill, p1, pair.decode, d1)
        used = set()
        for n in range(6):
            before = [e.metric(GEN) for e in engines]
            conv = Conversation(router.url, True, True, "derived", uuid.uuid4().hex, max_tokens=8)
            replies = [conv.turn(f"conversation {n} turn {t} " * 4) for t in range(3)]
            assert [r.outcome for r in replies] == ["miss", "hit", "hit"]
            grew = [e.metric(GEN) - b for e, b in zip(engines, before, strict=True)]
            assert sorted(grew[:2]) == [0, 3]  # every turn on one prefill (one token each)
            assert sorted(grew[2:]) == [0, 24]  # every turn on one decode (8 tokens each)
            used.add((grew[0] > 0, grew[2] > 0))
        assert len(used) > 1  # and the conversations spread over the instances
        assert corrupt(*engines) == 0


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_poison_prompts_are_their_own_answer_and_eject_nothing(tmp_path: Path, side: str) -> None:
    fault = ["--poison-marker", "POISON-PILL"]
    with (
        sim_pair(tmp_path, speed=SPEED, **{f"{side}_args": fault}) as pair,  # type: ignore[arg-type]
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url]) as router,
    ):
        def poison(i: int) -> httpx.Response:
            body = {"model": "Qwen", "prompt": f"POISON-PILL {i}", "max_tokens": 4}
            return httpx.post(router.url + "/v1/completions", json=body, timeout=30)

        def innocent(i: int) -> Reply:
            return Conversation(router.url, True, False, "body", uuid.uuid4().hex).turn(f"innocent {i}")

        with ThreadPoolExecutor(12) as pool:
            bad = [pool.submit(poison, i) for i in range(6)]
            good = [pool.submit(innocent, i) for i in range(12)]
            poisoned, replies = [f.result() for f in bad], [f.result() for f in good]
        assert all(r.status == 200 and r.text for r in replies)  # 0 failures for everyone else
        for r in poisoned:
            err = r.json()["error"]
            assert r.status_code == 502 and err["code"] == 502 and "--poison-marker" in err["message"]
        stats = router.stats()
        assert [(u["healthy"], u["failures"]) for u in (*stats["prefill"], *stats["decode"])] == [(True, 0)] * 2
        assert "ejected" not in router.log_text()
