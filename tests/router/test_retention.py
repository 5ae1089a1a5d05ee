"""Retained KV yields to new work: real routers and simulated engines, the decode's KV judged by its own /metrics."""

from __future__ import annotations

import concurrent.futures
import uuid
from pathlib import Path

import httpx

from tests.router.conftest import corrupt
from tests.router.faults import eventually
from tests.router.retained import (
    NUM_BLOCKS,
    Chat,
    journals,
    released,
    retention,
    router_on,
    sigkill,
    small_pair,
    used_blocks,
)

HIGH, TARGET = 0.6, 0.4


def settled(router_url: str) -> bool:
    """No release on its way and the decode back under the high-water mark."""
    section = httpx.get(f"{router_url}/stats", timeout=10).json()["retention"]
    usage = section["decodes"][0]["kv_usage"]
    return section["release_queue"] == 0 and usage is not None and usage <= HIGH


def test_new_conversations_are_served_while_retained_kv_yields_least_valuable_first(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with small_pair(tmp_path) as pd:
        # An earlier router pins KV and is killed: nothing of it releases those blocks but its journal.
        earlier = router_on(pd, tmp_path, state, name="earlier")
        for _ in range(5):
            assert Chat(earlier.url, uuid.uuid4().hex, words=80).turn()[0] == 200
        left = used_blocks(pd.decode)
        assert left > 0
        sigkill(earlier)

        router = router_on(pd, tmp_path, state, "--retain-high-kv", str(HIGH), "--retain-target-kv", str(TARGET))
        try:
            # Two conversations that took a second turn (the oldest handles), then eight that never did.
            continued = [Chat(router.url, uuid.uuid4().hex) for _ in range(2)]
            for chat in continued:
                assert chat.turn()[0] == 200
                assert chat.turn()[:2] == (200, "hit")
            once = [Chat(router.url, uuid.uuid4().hex, words=80) for _ in range(8)]
            for chat in once:
                assert chat.turn()[0] == 200
            assert eventually(lambda: released(router, "reclaimed_at_start") == 5), retention(router)
            assert len(journals(state)) == 1  # the killed router's journal is gone, taken over
            assert released(router, "pressure") == 0

            # A burst of new conversations needing more KV than the decode has left with everything retained:
            # without releases its later requests would wait for the decode's 480 s TTL.
            burst = [Chat(router.url, uuid.uuid4().hex, words=200) for _ in range(16)]
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                replies = list(pool.map(lambda c: c.turn(), burst))
            assert [status for status, _, _ in replies] == [200] * len(burst)
            assert eventually(lambda: settled(router.url)), retention(router)
            assert eventually(lambda: used_blocks(pd.decode) <= HIGH * NUM_BLOCKS), used_blocks(pd.decode)
            section = retention(router)
            assert released(router, "pressure") >= len(once), section
            assert section["pressure_events"] >= 1

            # Never-continued first: the two oldest handles, which did continue, are still there; the older of
            # the never-continued ones are gone, and their next turns miss (recomputed, never wrong KV).
            for chat in continued:
                assert chat.turn()[:2] == (200, "hit")
            assert once[0].turn() == (200, "miss", "released")
            assert corrupt(pd.prefill, pd.decode) == 0
        finally:
            router.stop()


def test_a_turn_marked_single_turn_keeps_no_kv_on_the_decode(tmp_path: Path) -> None:
    with small_pair(tmp_path) as pd:
        router = router_on(pd, tmp_path, tmp_path / "state")
        try:
            chats = [Chat(router.url, uuid.uuid4().hex) for _ in range(4)]
            for chat in chats:
                assert chat.turn(headers={"X-PD-Retain": "no"})[0] == 200
            assert eventually(lambda: released(router, "single_turn") == 4), retention(router)
            assert router.stats()["live_handles"] == 0
            assert eventually(lambda: used_blocks(pd.decode) == 0), used_blocks(pd.decode)
            # A client that did continue anyway gets a miss: its KV went, nothing wrong was read.
            assert chats[0].turn() == (200, "miss", "released")
            kept = Chat(router.url, uuid.uuid4().hex)
            assert kept.turn(headers={"X-PD-Retain": "yes"})[0] == 200
            assert kept.turn()[:2] == (200, "hit")
            assert corrupt(pd.prefill, pd.decode) == 0
        finally:
            router.stop()


def test_a_long_run_of_new_conversations_keeps_the_router_bounded(tmp_path: Path) -> None:
    max_handles = 24
    with small_pair(tmp_path) as pd:
        router = router_on(pd, tmp_path, tmp_path / "state", "--max-handles", str(max_handles),
                           "--retain-high-kv", str(HIGH), "--retain-target-kv", str(TARGET))
        try:
            def one(i: int) -> int:
                headers = {"X-PD-Retain": "no"} if i % 3 == 0 else None
                return Chat(router.url, uuid.uuid4().hex, words=60).turn(headers=headers)[0]

            seen = []
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                for wave in range(6):
                    statuses = list(pool.map(one, range(wave * 40, (wave + 1) * 40)))
                    assert statuses == [200] * 40
                    stats = router.stats()
                    section = stats["retention"]
                    seen.append((stats["live_handles"], section["release_queue"], section["journal"]["pins"]))
            assert all(handles <= max_handles for handles, _, _ in seen), seen
            assert all(pins <= handles + queue for handles, queue, pins in seen), seen
            assert eventually(lambda: settled(router.url)), retention(router)
            section = retention(router)
            assert section["release_queue"] == 0
            assert section["journal"]["pins"] == router.stats()["live_handles"] <= max_handles
            single = section["releases"]["single_turn"]  # alone, or carried by the next new conversation's prefill
            assert single.get("sent", 0) + single.get("carried", 0) == 80 and "failed" not in single, single
            text = httpx.get(f"{router.url}/metrics", timeout=10).text
            for result, n in single.items():
                assert f'pdctl_router_kv_releases_total{{reason="single_turn",result="{result}"}} {n:.1f}' in text
            assert "pdctl_router_release_queue 0.0" in text
            blocks = section["decodes"][0]["retained_blocks"]
            assert eventually(lambda: f'pdctl_router_retained_blocks{{index="0"}} {blocks:.1f}' in
                              httpx.get(f"{router.url}/metrics", timeout=10).text)
            assert 'pdctl_router_decode_kv_usage{index="0"}' in text
            assert corrupt(pd.prefill, pd.decode) == 0
        finally:
            router.stop()
