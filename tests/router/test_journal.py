"""No router leaves pins behind: the pin journal, with real router processes (SIGKILL, SIGTERM, live siblings) and
simulated engines, and the journal file's own rules (locks, torn lines, compaction)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import time
import uuid
from array import array
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from pdctl.router.kv.handles import Handle
from pdctl.router.kv.journal import SUBDIR, Journal, read_pins
from pdctl.router.kv.release import ReleaseMetrics, Releaser
from pdctl.router.upstream.client import LeanClient
from pdctl.router.upstream.pools import Pool
from tests.router.conftest import corrupt
from tests.router.faults import eventually
from tests.router.retained import Chat, journals, released, retention, router_on, sigkill, small_pair, used_blocks


def test_a_killed_routers_pins_are_released_by_the_next_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with small_pair(tmp_path) as pd:
        first = router_on(pd, tmp_path, state, name="first")
        chats = [Chat(first.url, uuid.uuid4().hex) for _ in range(6)]
        for chat in chats:
            assert chat.turn()[0] == 200
        assert used_blocks(pd.decode) > 0
        sigkill(first)
        assert len(journals(state)) == 1
        second = router_on(pd, tmp_path, state, name="second")
        try:
            assert eventually(lambda: used_blocks(pd.decode) == 0), used_blocks(pd.decode)
            assert released(second, "reclaimed_at_start") == 6
            assert journals(state) == [Path(retention(second)["journal"]["path"]).name]
            # The new router never held those conversations: their next turns start over, on the right KV.
            again = Chat(second.url, chats[0].cid, messages=list(chats[0].messages))
            assert again.turn() == (200, "miss", "new_conversation")
            assert corrupt(pd.prefill, pd.decode) == 0
        finally:
            second.stop()


def test_a_live_siblings_journal_is_left_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with small_pair(tmp_path) as pd:
        one = router_on(pd, tmp_path, state, name="one")
        try:
            chat = Chat(one.url, uuid.uuid4().hex)
            assert chat.turn()[0] == 200
            assert eventually(lambda: retention(one)["journal"]["written"] == 1)
            two = router_on(pd, tmp_path, state, name="two")
            try:
                assert len(journals(state)) == 2
                assert retention(two)["releases"] == {}
                assert chat.turn()[:2] == (200, "hit")  # its KV is still on the decode, its handle still valid
            finally:
                two.stop()
        finally:
            one.stop()


def test_sigterm_releases_every_pin_and_removes_the_journal(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with small_pair(tmp_path) as pd:
        router = router_on(pd, tmp_path, state)
        for _ in range(5):
            assert Chat(router.url, uuid.uuid4().hex).turn()[0] == 200
        assert used_blocks(pd.decode) > 0
        router.proc.send_signal(signal.SIGTERM)
        router.proc.wait(timeout=30)  # uvicorn re-raises the SIGTERM once its shutdown is complete
        assert "Application shutdown complete" in router.log_text()
        assert "releasing 5 retained handle(s)" in router.log_text()
        assert eventually(lambda: used_blocks(pd.decode) == 0), used_blocks(pd.decode)
        assert journals(state) == []


def test_pins_a_stopping_router_could_not_release_are_left_to_the_next(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with small_pair(tmp_path) as pd:
        router = router_on(pd, tmp_path, state, "--shutdown-release-timeout", "0", name="first")
        for _ in range(3):
            assert Chat(router.url, uuid.uuid4().hex).turn()[0] == 200
        router.proc.send_signal(signal.SIGTERM)
        router.proc.wait(timeout=30)
        assert "Application shutdown complete" in router.log_text()
        assert len(journals(state)) == 1 and used_blocks(pd.decode) > 0
        second = router_on(pd, tmp_path, state, name="second")
        try:
            assert eventually(lambda: used_blocks(pd.decode) == 0), used_blocks(pd.decode)
            assert released(second, "reclaimed_at_start") == 3
        finally:
            second.stop()


def _handle(n: int, url: str = "http://d:1") -> Handle:
    params = {"remote_request_id": f"req-{n}", "remote_engine_id": "e", "remote_host": "h", "remote_port": 1,
              "remote_block_ids": [[n]], "remote_num_tokens": 16, "do_remote_decode": False,
              "do_remote_prefill": True, "remote_blocks_expiry_time": 1.0}
    return Handle(f"c{n}", params, url, array("i", [7, 8]), 0.0, 1.0)


def test_the_journal_records_net_changes_and_compacts(tmp_path: Path) -> None:
    j = Journal(str(tmp_path), ttl=480)
    assert j.open() == {}
    assert j.path is not None
    for n in range(4):
        j.pin(_handle(n))
    j.unpin(_handle(3))  # pinned and gone within one flush: never written
    j.flush()
    j.unpin(_handle(0))
    j.flush()
    lines = j.path.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[-1]) == {"k": ["http://d:1", "req-0"], "-": 1}
    pins = read_pins([*lines, '{"k": ["http://d:1", "req-9"'])  # a torn last line (killed mid-write) is skipped
    assert sorted(k[1] for k in pins) == ["req-1", "req-2"]
    assert pins[("http://d:1", "req-1")].token == 7
    assert "remote_blocks_expiry_time" not in pins[("http://d:1", "req-1")].params
    j.compact()
    assert len(j.path.read_text().splitlines()) == 2
    assert sorted(k[1] for k in read_pins(j.path.read_text().splitlines())) == ["req-1", "req-2"]
    j.close()
    assert j.path.exists()  # two pins left: kept for the next router


def test_only_unlocked_journals_are_taken_over_and_expired_pins_are_skipped(tmp_path: Path) -> None:
    now = [1000.0]
    live = Journal(str(tmp_path), ttl=100, wall=lambda: now[0])
    live.open()
    live.pin(_handle(1))
    live.flush()
    dead = tmp_path / SUBDIR / "router-1-dead.journal"
    entries = [{"k": ["u", "old"], "d": "u", "p": {}, "t": 0, "x": 900.0},
               {"k": ["u", "new"], "d": "u", "p": {"remote_request_id": "new"}, "t": 5, "x": 1100.0}]
    dead.write_text("".join(json.dumps(e) + "\n" for e in entries))
    fresh_tmp = tmp_path / SUBDIR / ".router-2-x.journal.a.tmp"
    stale_tmp = tmp_path / SUBDIR / ".router-3-y.journal.b.tmp"
    fresh_tmp.write_text("")  # a router making its journal right now: not yet locked, left alone
    stale_tmp.write_text("")  # a router that died making it
    os.utime(stale_tmp, (time.time() - 3600, time.time() - 3600))
    newcomer = Journal(str(tmp_path), ttl=100, wall=lambda: now[0])
    taken = newcomer.open()
    assert list(taken) == [("u", "new")] and taken[("u", "new")].token == 5
    assert not dead.exists() and not stale_tmp.exists() and fresh_tmp.exists()
    fresh_tmp.unlink()
    assert live.path is not None and live.path.exists()  # locked by a live router: left alone
    with live.path.open() as f:  # and still locked
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = False
        except BlockingIOError:
            locked = True
    assert locked
    live.unpin(_handle(1))
    live.close()
    newcomer.close()
    assert list((tmp_path / SUBDIR).iterdir()) == []


def test_a_release_that_failed_stays_in_the_journal_for_the_next_router(tmp_path: Path) -> None:
    async def run() -> tuple[int, int]:
        answers = iter([500, 200])
        registry = CollectorRegistry()
        releaser = Releaser(Pool("prefill", ["http://p:1"]), Pool("decode", ["http://d:1"]), "m",
                            ReleaseMetrics(registry), 1)
        releaser.client = LeanClient(transport=httpx.MockTransport(lambda _: httpx.Response(next(answers))),
                                     timeout=httpx.Timeout(5))
        journal = Journal(str(tmp_path), ttl=480)
        journal.open()
        releaser.journal = journal
        releaser.submit(_handle(1), "pressure")  # the prefill refuses it: the decode still holds the blocks
        assert await releaser.drained(5)
        after_failure = len(journal)
        releaser.submit(_handle(2), "pressure")
        assert await releaser.drained(5)
        await releaser.client.aclose()
        journal.close()
        return after_failure, len(journal)

    assert asyncio.run(run()) == (1, 1)  # the failed one stays, the sent one is gone
    assert sorted(k[1] for p in journals(tmp_path) for k in
                  read_pins((tmp_path / SUBDIR / p).read_text().splitlines())) == ["req-1"]
