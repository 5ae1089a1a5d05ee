"""Releases: the decode KV of handles no turn will read is freed, observed at the decode simulator's own blocks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
import uuid
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from prometheus_client import CollectorRegistry

from pdctl.router.kv.handles import Handle
from pdctl.router.kv.release import ReleaseMetrics, Releaser, release_body, release_params
from pdctl.router.upstream.client import LeanClient
from pdctl.router.upstream.pools import Pool
from tests.conftest import free_port
from tests.router.conftest import BLOCK, SPEED, RouterProc, corrupt, router_process
from tests.router.faults import eventually
from tests.router.talk import Conversation
from tests.support.sim_procs import SERVED, SimPair, SimProc, kv_config, sim_pair

NUM_BLOCKS = 400
LEASE_S = 1.0  # the prefill's kv_lease_duration: how long it keeps a finished request's blocks for a decode


def used_blocks(sim: SimProc) -> int:
    return round(sim.metric("vllm:kv_cache_usage_perc") * NUM_BLOCKS)


@contextlib.contextmanager
def fresh(tmp_path: Path, *router_args: str, decode_args: tuple[str, ...] = (),
          prefill: tuple[str, ...] = ()) -> Iterator[tuple[SimPair, RouterProc]]:
    """A sim pair of its own (nothing else pins its decode's blocks) and a router in front of it."""
    with sim_pair(tmp_path, speed=SPEED, block_size=BLOCK, num_blocks=NUM_BLOCKS, decode_args=decode_args,
                  prefill_args=("--kv-transfer-config", kv_config("prefill", threshold=0, lease=LEASE_S))) as pd, \
            router_process(tmp_path, [*prefill, pd.prefill_url], [pd.decode_url], *router_args) as router:
        yield pd, router


def pinned(router: RouterProc) -> int:
    """The decode blocks the router's live handles pin, by its own count."""
    return sum(router.stats()["pinned_tokens"].values()) // BLOCK


def turn(router: RouterProc, cid: str, words: int = 40) -> Conversation:
    conv = Conversation(router.url, True, True, "body", cid)
    reply = conv.turn(" ".join(f"{cid[:6]}-{i}" for i in range(words)))
    assert reply.status == 200 and (reply.outcome, reply.reason) == ("miss", "new_conversation")
    return conv


def test_an_evicted_handle_frees_its_blocks_on_the_decode(tmp_path: Path) -> None:
    with fresh(tmp_path, "--max-handles", "1") as (pd, router):
        a = turn(router, uuid.uuid4().hex)
        held_a = used_blocks(pd.decode)
        assert held_a > 0 and held_a == pinned(router)
        turn(router, uuid.uuid4().hex, words=60)  # the table holds one handle: a's goes
        held_b = pinned(router)
        assert held_b > held_a
        assert eventually(lambda: used_blocks(pd.decode) == held_b), (used_blocks(pd.decode), held_a, held_b)
        assert router.stats()["releases"] == {"evicted": 1}
        text = httpx.get(f"{router.url}/metrics", timeout=10).text
        assert 'pdctl_router_kv_releases_total{reason="evicted",result="sent"} 1.0' in text
        assert f'pdctl_router_pinned_tokens{{index="0"}} {held_b * BLOCK:.1f}' in text
        reply = a.turn("and then?")
        assert (reply.outcome, reply.reason) == ("miss", "evicted")


def test_a_replaced_handle_frees_its_blocks_on_the_decode(tmp_path: Path) -> None:
    # Two first turns of one conversation at once (the decode's pull is slowed so that they overlap): both start
    # without a handle and both leave one; the second replaces the first, whose blocks must not stay pinned.
    with fresh(tmp_path, decode_args=("--kv-pull-delay-ms", "400")) as (pd, router):
        cid = uuid.uuid4().hex
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(lambda w: turn(router, cid, w), (40, 41)))
        assert len(replies) == 2
        assert eventually(lambda: router.stats()["releases"] == {"replaced": 1}), router.stats()["releases"]
        assert eventually(lambda: used_blocks(pd.decode) == pinned(router)), (used_blocks(pd.decode), pinned(router))
        assert pinned(router) > 0


@pytest.mark.parametrize("knob", [("--pin-budget-tokens", str(20 * BLOCK)),
                                  ("--pin-budget-fraction", f"{20 / NUM_BLOCKS:g}")], ids=["tokens", "fraction"])
def test_over_the_pin_budget_the_least_recent_conversation_is_released(tmp_path: Path, knob: tuple[str, str]) -> None:
    budget = 20
    with fresh(tmp_path, *knob) as (pd, router):
        # a fraction of the decode's capacity, read from its /metrics (vllm:cache_config_info)
        assert eventually(lambda: router.stats()["pin_budget_tokens"] == {pd.decode_url: budget * BLOCK})
        first = turn(router, uuid.uuid4().hex, words=100)
        per = pinned(router)
        assert 2 * per <= budget < 3 * per, per  # two conversations fit the budget, a third does not
        turn(router, uuid.uuid4().hex, words=100)
        assert router.stats()["releases"] == {}
        turn(router, uuid.uuid4().hex, words=100)
        assert eventually(lambda: router.stats()["releases"] == {"pressure": 1}), router.stats()["releases"]
        assert pinned(router) <= budget
        assert eventually(lambda: used_blocks(pd.decode) == pinned(router)), (used_blocks(pd.decode), pinned(router))
        reply = first.turn("and then?")
        assert reply.status == 200 and reply.text
        assert (reply.outcome, reply.reason) == ("miss", "released")
        assert router.stats()["reuse_reasons"]["released"] == 1


def test_a_handle_a_turn_took_but_did_not_read_is_released_on_a_stock_prefill(tmp_path: Path) -> None:
    # verify_at router, with a prefill that lacks pdctl's prefix check (a vLLM pdctl did not patch): an edited
    # history is a miss decided at the router, so no prefill gets the handle the turn took; the release frees it.
    with sim_pair(tmp_path, speed=SPEED, block_size=BLOCK, num_blocks=NUM_BLOCKS,
                  prefill_args=("--no-prefix-check", "--kv-transfer-config",
                                kv_config("prefill", threshold=0, lease=LEASE_S))) as pd, \
            router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--verify-at", "router") as router:
        conv = turn(router, uuid.uuid4().hex, words=60)
        first = used_blocks(pd.decode)
        conv.messages[0]["content"] = "an edited first question " * 40
        reply = conv.turn("a second question")
        assert (reply.outcome, reply.reason) == ("miss", "prefix_diverged")
        assert eventually(lambda: router.stats()["releases"] == {"unread": 1}), router.stats()["releases"]
        # Only the new handle pins: without the release the first turn's blocks would be there too.
        assert eventually(lambda: used_blocks(pd.decode) == pinned(router)), (used_blocks(pd.decode), first)
        reply = conv.turn("a third question")
        assert (reply.outcome, reply.reason) == ("hit", "verified")  # the new handle is the one kept


def test_a_release_to_a_dead_prefill_fails_no_turn(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # listed first and never ejected: the release's first choice
    with fresh(tmp_path, "--max-handles", "1", "--health-interval", "3600", "--eject-after", "1000",
               prefill=(dead,)) as (pd, router):
        for words in (30, 31, 32):
            turn(router, uuid.uuid4().hex, words)
        assert eventually(lambda: router.stats()["releases_failed"] >= 1), router.stats()
        log = router.log_text()
        assert "release of a evicted handle on " + pd.decode_url + " failed" in log
        assert "its blocks stay pinned until the decode's TTL" in log
        text = httpx.get(f"{router.url}/metrics", timeout=10).text
        assert 'pdctl_router_kv_releases_total{reason="evicted",result="failed"}' in text


def _handle_from_decode(pd: SimPair, prompt: list[int]) -> dict[str, Any]:
    """One P/D turn by hand, as the router runs it: the decode's handle for the conversation's next turn."""
    miss = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}
    p = httpx.post(f"{pd.prefill_url}/v1/completions", timeout=30,
                   json={"model": SERVED, "prompt": prompt, "max_tokens": 1, "kv_transfer_params": miss})
    d = httpx.post(f"{pd.decode_url}/v1/completions", timeout=30,
                   json={"model": SERVED, "prompt": prompt, "max_tokens": 8,
                         "kv_transfer_params": p.json()["kv_transfer_params"]})
    params: dict[str, Any] = d.json()["kv_transfer_params"]
    assert params["do_remote_decode"] and params["remote_block_ids"]
    return params


@pytest.mark.parametrize("patched", [True, False], ids=["patched-prefill", "stock-prefill"])
def test_the_release_request_computes_one_token_and_frees_the_decode(tmp_path: Path, patched: bool) -> None:
    flags = () if patched else ("--no-prefix-check",)  # the simulator's stand-in for pdctl's patch to vLLM
    with sim_pair(tmp_path, speed=SPEED, block_size=BLOCK, num_blocks=NUM_BLOCKS,
                  prefill_args=(*flags, "--kv-transfer-config", kv_config("prefill", threshold=0, lease=LEASE_S))) \
            as pd:
        params = _handle_from_decode(pd, list(range(100, 300)))
        params["pdctl_prefix"] = {"v": 1, "n": 1}  # a handle stored with its digests: the release leaves them out
        assert used_blocks(pd.decode) == -(-(200 + 7) // BLOCK)
        assert eventually(lambda: used_blocks(pd.prefill) == 0)  # the turn's own lease ran out
        computed = pd.prefill.metric("vllm:prompt_tokens_total")
        h = Handle("c", params, pd.decode_url, array("i", [100, 101]), 0.0, 1.0)
        r = httpx.post(f"{pd.prefill_url}/v1/completions", json=release_body(h, SERVED), timeout=30)
        assert r.status_code == 200
        assert pd.prefill.metric("vllm:prompt_tokens_total") - computed == 1
        assert pd.prefill.metric("vllm:nixl_bytes_transferred_count") == 0  # nothing read from the decode
        assert eventually(lambda: used_blocks(pd.decode) == 0), used_blocks(pd.decode)
        if patched:
            assert used_blocks(pd.prefill) == 0 and r.json().get("kv_transfer_params") is None
        else:  # as stock vLLM 0.26.0: the release's one block waits for a decode's pull until kv_lease_duration
            assert used_blocks(pd.prefill) == 1
            assert eventually(lambda: used_blocks(pd.prefill) == 0)


def test_release_params_name_the_blocks_and_ask_for_nothing() -> None:
    params = {"do_remote_decode": False, "do_remote_prefill": True, "remote_block_ids": [[3, 4]],
              "remote_engine_id": "d", "remote_request_id": "r", "remote_host": "h", "remote_port": 1,
              "remote_num_tokens": 40, "remote_blocks_expiry_time": 9.0, "pdctl_prefix": {}, "tp_size": 1}
    out = release_params(params)
    assert out == {"do_remote_decode": True, "do_remote_prefill": False, "remote_block_ids": [[3, 4]],
                   "remote_engine_id": "d", "remote_request_id": "r", "remote_host": "h", "remote_port": 1,
                   "remote_num_tokens": 0, "tp_size": 1, "pdctl_release": True}
    assert params["remote_num_tokens"] == 40  # the handle itself is untouched
    body = release_body(Handle("c", params, "http://d", None, 0.0, 1.0), "m")
    assert (body["prompt"], body["max_tokens"], body["stream"], body["model"]) == ([0], 1, False, "m")


def test_release_options_are_checked_and_exit_2() -> None:
    from typer.testing import CliRunner

    from pdctl.cli import app as pdctl_app

    result = CliRunner().invoke(pdctl_app, ["router", "serve", "--prefill", "http://127.0.0.1:1", "--decode",
                                            "http://127.0.0.1:2", "--pin-budget-tokens", "-1",
                                            "--release-concurrency", "0"])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "Error: invalid router options: --pin-budget-tokens must be >= 0, got -1; --release-concurrency must be "
        ">= 1, got 0",
        "hint: see `pdctl router serve --help`",
    ]



def test_a_release_submitted_as_the_last_worker_finds_the_queue_empty_is_still_sent() -> None:
    # The worker leaves the running count in the step it finds the queue empty. A release submitted after that step
    # but before the task's done callbacks run (here: a callback the first send scheduled, ahead of them in the
    # loop's queue) must start a worker of its own, not wait in the queue for a later release to come.
    sent: list[str] = []

    class Recording(Releaser):
        async def _send(self, h: Handle, reason: str) -> bool:
            await asyncio.sleep(0)
            sent.append(h.conversation)
            if h.conversation == "first":
                asyncio.get_running_loop().call_soon(self.submit, Handle("second", {}, "http://d", None, 0.0, 1.0),
                                                     "unread")
            return True

    async def main() -> None:
        r = Recording(Pool("prefill", ["http://p"]), Pool("decode", ["http://d"]), "m",
                      ReleaseMetrics(CollectorRegistry()), concurrency=1)
        r.client = cast(LeanClient, object())  # submit only checks that the router set one
        r.submit(Handle("first", {}, "http://d", None, 0.0, 1.0), "unread")
        assert await r.drained(2.0), f"a release never went out: sent {sent}, queued {r.queued}"
        await asyncio.sleep(0.05)
        assert await r.drained(2.0), f"the second release never went out: sent {sent}, queued {r.queued}"
        assert sent == ["first", "second"] and r.queued == 0
        await r.close()

    asyncio.run(main())


@pytest.mark.parametrize("carry_ms", ["3000", "0"], ids=["carried", "alone"])
def test_a_new_conversations_prefill_carries_the_release_of_the_handle_it_displaced(tmp_path: Path,
                                                                                     carry_ms: str) -> None:
    # One handle kept: each new conversation displaces the last one's handle, whose release waits (3 s) for a turn
    # to carry it. The first goes alone (nothing has linked this prefill to the decode yet); then c's turn displaces
    # b's handle and d's prefill request carries its release: the decode frees b's blocks with no request added.
    # With --release-carry-ms 0 every release goes alone.
    with fresh(tmp_path, "--max-handles", "1", "--release-carry-ms", carry_ms) as (pd, router):
        turn(router, uuid.uuid4().hex)
        b = turn(router, uuid.uuid4().hex, words=60)  # a's release: alone, after the window
        assert eventually(lambda: released(router) == 1), router.stats()
        assert 'reason="evicted",result="sent"} 1.0' in httpx.get(f"{router.url}/metrics", timeout=10).text
        held_b = pinned(router)
        turn(router, uuid.uuid4().hex, words=70)  # c: b's handle goes to the queue
        held_c = pinned(router)
        if carry_ms != "0":
            assert used_blocks(pd.decode) == held_b + held_c  # b's release waits for a carrier
        served = pd.prefill.metric("vllm:e2e_request_latency_seconds_count")
        turn(router, uuid.uuid4().hex, words=80)  # d: carries b's release (c's now waits in its turn)
        held_d = pinned(router)
        waiting_c = held_c if carry_ms != "0" else 0
        assert eventually(lambda: used_blocks(pd.decode) == held_d + waiting_c), (
            used_blocks(pd.decode), held_b, held_c, held_d)
        text = httpx.get(f"{router.url}/metrics", timeout=10).text
        carried = 'pdctl_router_kv_releases_total{reason="evicted",result="carried"} 1.0'
        if carry_ms != "0":
            assert carried in text and 'reason="evicted",result="sent"} 1.0' in text, text
            # d's request was the only one its prefill got: no one-token release beside it
            assert pd.prefill.metric("vllm:e2e_request_latency_seconds_count") - served == 1
            assert router.stats()["retention"]["releases"]["evicted"] == {"sent": 1, "carried": 1}
        else:
            assert carried not in text
            assert eventually(lambda: released(router) == 3), router.stats()
        reply = b.turn("and then?")  # its handle was released: a miss, never a read of freed blocks
        assert (reply.status, reply.outcome) == (200, "miss") and reply.reason in ("evicted", "new_conversation")
        assert corrupt(pd.prefill, pd.decode) == 0


def released(router: RouterProc) -> int:
    """Evicted handles' releases done: sent alone or carried."""
    done = router.stats()["retention"]["releases"].get("evicted", {})
    return int(done.get("sent", 0)) + int(done.get("carried", 0))


def test_a_turn_carries_a_release_only_where_a_release_of_its_own_linked_the_prefill_and_the_decode() -> None:
    # The first release on a pair goes alone (a first contact may start a NIXL handshake); then turns to that
    # prefill carry them, until either engine restarts (a new generation) or the link is older than LINK_S.
    sent: list[str] = []

    class Recording(Releaser):
        async def _send(self, h: Handle, reason: str) -> bool:
            sent.append(h.conversation)
            p = self.prefill.members[0]
            self._links[p.url, h.decode_url] = (p.generation, h.generation, time.monotonic())
            return True

    async def main() -> None:
        prefill, decode = Pool("prefill", ["http://p"]), Pool("decode", ["http://d"])
        r = Recording(prefill, decode, "m", ReleaseMetrics(CollectorRegistry()), concurrency=1, carry_s=0.05)
        r.client = cast(LeanClient, object())
        p = prefill.members[0]
        r.submit(Handle("a", {}, "http://d", None, 0.0, 1.0), "evicted")
        assert r.take(p) is None  # not linked yet: a's release goes alone after the window
        assert await r.drained(2.0) and sent == ["a"]
        r.submit(Handle("b", {}, "http://d", None, 0.0, 1.0), "evicted")
        q = r.take(p)
        assert q is not None and q.handle.conversation == "b" and r.queued == 1
        r.carried(q, p, True)
        assert r.queued == 0 and r.metrics.results[("evicted", "carried")] == 1
        r.submit(Handle("c", {}, "http://d", None, 0.0, 1.0), "evicted")
        q = r.take(p)
        assert q is not None
        r.carried(q, p, False)  # its carrier failed: back to a worker, sent alone, never carried again
        assert r.take(p) is None
        assert await r.drained(2.0) and sent == ["a", "c"]
        p.generation += 1  # the prefill restarted: its NIXL agent knows nobody
        r.submit(Handle("d", {}, "http://d", None, 0.0, 1.0), "evicted")
        assert r.take(p) is None
        assert await r.drained(2.0) and sent == ["a", "c", "d"]
        await r.close()

    asyncio.run(main())


@pytest.mark.parametrize("calm_s", ["30", "0"], ids=["calm-waits", "calm-off"])
def test_an_evicted_handles_release_waits_for_a_carrier_while_its_decode_is_calm(tmp_path: Path,
                                                                                 calm_s: str) -> None:
    # The decode's KV is nearly empty (calm): once the pair is linked, an evicted handle's release waits past
    # --release-carry-ms (50) for the next new conversation to carry it, instead of a one-token request of its own;
    # its blocks stay on the decode meanwhile. With --release-calm-carry-s 0 it goes alone after the 50 ms.
    with fresh(tmp_path, "--max-handles", "1", "--release-carry-ms", "50", "--release-calm-carry-s", calm_s) as (
            pd, router):
        turn(router, uuid.uuid4().hex)
        turn(router, uuid.uuid4().hex, words=60)  # a's release: alone (the pair is not linked yet)
        assert eventually(lambda: released(router) == 1), router.stats()
        held_b = pinned(router)
        assert eventually(lambda: router.stats()["retention"]["decodes"][0]["kv_usage"] is not None)
        turn(router, uuid.uuid4().hex, words=70)  # c: b's handle is evicted
        held_c = pinned(router)
        time.sleep(1.0)  # twenty carry windows
        releases = router.stats()["retention"]["releases"]["evicted"]
        served = pd.prefill.metric("vllm:e2e_request_latency_seconds_count")
        if calm_s == "0":
            assert releases == {"sent": 2}, releases
            assert used_blocks(pd.decode) == held_c
            return
        assert releases == {"sent": 1}, releases  # b's release still waits
        assert used_blocks(pd.decode) == held_b + held_c
        turn(router, uuid.uuid4().hex, words=80)  # d carries it: no request besides its own
        assert eventually(lambda: router.stats()["retention"]["releases"]["evicted"] == {"sent": 1, "carried": 1})
        assert pd.prefill.metric("vllm:e2e_request_latency_seconds_count") - served == 1
        assert corrupt(pd.prefill, pd.decode) == 0


def test_a_release_waiting_on_a_calm_decode_goes_once_it_is_calm_no_more_or_a_drain_wants_it() -> None:
    # Each release is an evicted (or expired) handle on the linked pair (p, d). While `calm` says yes it waits for a
    # carrier (calm_carry_s 30 s); when it says no, it goes within CALM_RECHECK_S of that; a drain sends the next at
    # once; a release of another reason, to a decode no prefill is linked to, or close to the decode's own TTL,
    # waits only carry_s.
    sent: list[str] = []
    calm = {"http://d": True, "http://e": True}

    class Recording(Releaser):
        async def _send(self, h: Handle, reason: str) -> bool:
            sent.append(h.conversation)
            self._links["http://p", h.decode_url] = (0, 0, time.monotonic())  # as a release sent alone links
            return True

    def evicted(name: str, decode: str = "http://d", age: float = 0.0) -> Handle:
        now = time.monotonic()
        return Handle(name, {}, decode, None, now - age, now - age + 1.0)

    async def until(name: str, within: float) -> float:
        t0 = time.monotonic()
        while name not in sent:
            assert time.monotonic() - t0 < within, f"{name} not sent within {within}s: sent {sent}"
            await asyncio.sleep(0.01)
        return time.monotonic() - t0

    async def main() -> None:
        r = Recording(Pool("prefill", ["http://p"]), Pool("decode", ["http://d", "http://e"]), "m",
                      ReleaseMetrics(CollectorRegistry()), concurrency=1, carry_s=0.05, calm_carry_s=30.0)
        r.client = cast(LeanClient, object())  # submit only checks that the router set one
        r.calm = calm.__getitem__
        r.submit(evicted("first"), "evicted")  # nothing linked to d yet: alone after carry_s
        await until("first", 1.0)
        r.submit(evicted("second"), "evicted")
        await asyncio.sleep(0.6)
        assert sent == ["first"], sent  # calm and linked: waiting for a carrier
        calm["http://d"] = False
        assert await until("second", 1.0) <= 0.3 + 0.1
        calm["http://d"] = True
        r.submit(evicted("third"), "evicted")
        await asyncio.sleep(0.3)
        assert "third" not in sent
        assert await r.drained(1.0) and sent[-1] == "third"  # a drain does not wait for a carrier
        r.submit(evicted("fourth", "http://e"), "evicted")  # e: no prefill linked to it yet
        await until("fourth", 0.5)
        r.submit(evicted("fifth"), "unread")  # neither evicted nor expired: carry_s only
        await until("fifth", 0.5)
        r.submit(evicted("sixth"), "expired")  # expired: waits as an evicted one does
        await asyncio.sleep(0.3)
        assert "sixth" not in sent
        # ... but never past 5 s before the decode's own TTL (480 s) frees the blocks: this one's is 4 s away
        r.submit(evicted("seventh", age=476.0), "expired")
        await until("seventh", 0.5)
        assert "sixth" not in sent  # the queue's order: the one behind went first, the one waiting still waits
        await r.close()

    asyncio.run(main())
