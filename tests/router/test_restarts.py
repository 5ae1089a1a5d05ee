"""Engines that die and come back: no handle outlives the decode process that issued it, and a prefill's death
is never blamed on the decodes (issue 21, items 1 and 6). The simulator's oracle must stay 0 throughout."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from tests.router.conftest import SPEED, corrupt, router_process
from tests.router.faults import eventually, kill
from tests.router.talk import Conversation, Reply
from tests.support.sim_procs import SimProc, sim_pair, sim_process, start_sim

GEN = "vllm:generation_tokens_total"


def restart_in_place(sim: SimProc, log_dir: Path, **kwargs: object) -> SimProc:
    """SIGKILL the engine and start a new one (a new engine id) on the same API and side-channel ports."""
    kill(sim)
    return start_sim(log_dir, sim.role, name=f"{sim.name}-again", port=sim.port, side_port=sim.side_port,
                     speed=SPEED, **kwargs)  # type: ignore[arg-type]


def first_turns(url: str, n: int) -> list[Conversation]:
    convs = [Conversation(url, i % 2 == 0, True, "body", uuid.uuid4().hex) for i in range(n)]
    for i, conv in enumerate(convs):
        assert conv.turn(f"conversation {i} opens with a long first turn " * 6).status == 200
    return convs


def test_turn_two_after_a_decode_restart_on_the_same_port_is_a_clean_miss(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=SPEED) as pair,
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url]) as router,
    ):
        convs = first_turns(router.url, 10)
        decode = restart_in_place(pair.decode, tmp_path)
        try:
            replies = [conv.turn(" and the second turn") for conv in convs]
            assert all(r.status == 200 and r.text for r in replies)
            assert [(r.outcome, r.reason) for r in replies] == [("miss", "decode_restarted")] * 10
            assert [conv.turn(" a third").outcome for conv in convs] == ["hit"] * 10  # the new handles work
            assert corrupt(pair.prefill, decode) == 0
        finally:
            decode.stop()


def test_a_decode_ejected_and_readmitted_issues_fresh_handles_only(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=SPEED) as pair,
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url]) as router,
    ):
        convs = first_turns(router.url, 5)
        kill(pair.decode)
        assert eventually(lambda: router.stats()["decode"][0]["healthy"] is False)
        decode = restart_in_place(pair.decode, tmp_path)
        try:
            assert eventually(lambda: router.stats()["decode"][0]["healthy"] is True)
            replies = [conv.turn(" back again") for conv in convs]
            assert [(r.status, r.outcome, r.reason) for r in replies] == [(200, "miss", "decode_restarted")] * 5
            assert corrupt(pair.prefill, decode) == 0
        finally:
            decode.stop()


def test_a_new_engine_id_in_an_answer_retires_the_old_handles(tmp_path: Path) -> None:
    # No health check runs after the first one; the tripwire is what notices the restart, and the new engine id
    # the next answer carries would too.
    with (
        sim_pair(tmp_path, speed=SPEED) as pair,
        router_process(tmp_path, [pair.prefill_url], [pair.decode_url], "--health-interval", "600") as router,
    ):
        convs = first_turns(router.url, 3)
        generation = router.stats()["decode"][0]["generation"]
        decode = restart_in_place(pair.decode, tmp_path)
        try:
            assert eventually(lambda: router.stats()["decode"][0]["generation"] > generation)
            assert Conversation(router.url, True, True, "body", uuid.uuid4().hex).turn("new " * 20).status == 200
            replies = [conv.turn(" next") for conv in convs]
            assert [(r.status, r.outcome, r.reason) for r in replies] == [(200, "miss", "decode_restarted")] * 3
            assert corrupt(pair.prefill, decode) == 0
        finally:
            decode.stop()


def test_a_prefill_dying_before_the_decode_pulls_reruns_the_prefill_elsewhere(tmp_path: Path) -> None:
    # The decode waits 1.5 s before pulling, so the prefill that answered can be killed before the pull.
    with (
        sim_pair(tmp_path, speed=SPEED, decode_args=["--kv-pull-delay-ms", "1500"]) as pair,
        sim_process(tmp_path, "prefill", name="prefill-1", speed=SPEED) as p1,
        router_process(tmp_path, [pair.prefill_url, p1.url], [pair.decode_url]) as router,
    ):
        prefills = (pair.prefill, p1)
        conv = Conversation(router.url, True, True, "body", uuid.uuid4().hex)
        out: list[Reply] = []
        worker = threading.Thread(target=lambda: out.append(conv.turn("which prefill serves me " * 6)))
        worker.start()
        assert eventually(lambda: any(p.metric(GEN) >= 1 for p in prefills))
        dead = next(p for p in prefills if p.metric(GEN) >= 1)
        live = p1 if dead is pair.prefill else pair.prefill
        kill(dead)
        worker.join(30)
        reply = out[0]
        assert reply.status == 200 and reply.text and not any("error" in e for e in reply.events)
        assert live.metric(GEN) == 1  # the prefill ran again, on the live instance
        decode = router.stats()["decode"][0]
        assert decode["healthy"] is True and decode["failures"] == 0  # not the decode's fault
        assert pair.decode.metric("vllm:nixl_num_failed_transfers_total") == 1
        assert conv.turn(" and on").outcome == "hit"
        assert corrupt(live, pair.decode) == 0
