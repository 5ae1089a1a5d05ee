"""The members file applied to a router's state: joins, drains (handles released, no new turn), removal once idle,
a bad file changing nothing. In-process on a real RouterState inside a running event loop (no HTTP involved)."""

from __future__ import annotations

import asyncio
import json
from array import array
from pathlib import Path

from pdctl.router.config import RouterConfig
from pdctl.router.kv.handles import Handle
from pdctl.router.server.membership import Membership
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream.members import Members

P0, D0, D1 = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"


def _state(path: Path) -> RouterState:
    return RouterState.create(RouterConfig(prefill=(P0,), decode=(D0,), members_file=str(path), release=False))


def _handle(cid: str, url: str) -> Handle:
    return Handle(cid, {"remote_num_tokens": 3}, url, array("i", [1, 2, 3]), 0.0, 1e12, None)


def test_join_drain_and_leave(tmp_path: Path) -> None:
    path = tmp_path / "members.json"

    async def run() -> None:
        state = _state(path)
        m = Membership(state)
        path.write_text(json.dumps({"prefill": [P0], "decode": [D0, D1]}))
        m.start()
        assert [u.url for u in state.decode.members] == [D0, D1]
        state.handles.put(_handle("a", D1))
        state.handles.put(_handle("b", D0))
        d1 = state.decode.by_url(D1)
        assert d1 is not None
        d1.outstanding = 1  # a stream in flight on it

        m.apply(Members((P0,), (D0, D1), frozenset({D1})))
        assert d1.draining and d1 not in state.decode.healthy()
        assert state.handles.get("a") is None and state.handles.get("b") is not None  # only D1's handles go
        assert state.handles.take("a").reason == "released"
        assert state.stale(_handle("x", D1))

        m.apply(Members((P0,), (D0,)))
        assert state.decode.by_url(D1) is d1  # still streaming: stays until idle
        d1.outstanding = 0
        m.prune()
        assert [u.url for u in state.decode.members] == [D0]
        for t in m.tasks():
            t.cancel()
        await asyncio.gather(*m.tasks(), return_exceptions=True)

    asyncio.run(run())


def test_a_bad_file_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "members.json"

    async def run() -> None:
        state = _state(path)
        m = Membership(state)
        path.write_text('{"prefill": "not a list"}')
        m.start()
        path.write_text(json.dumps({"prefill": [P0], "decode": []}))
        m.reload()
        assert [u.url for u in state.decode.members] == [D0] and not state.decode.members[0].draining
        for t in m.tasks():
            t.cancel()
        await asyncio.gather(*m.tasks(), return_exceptions=True)

    asyncio.run(run())


def test_draining_member_back_starts_a_new_generation(tmp_path: Path) -> None:
    async def run() -> None:
        state = _state(tmp_path / "none.json")
        m = Membership(state)
        m.start()  # no file: the argv's members
        d0 = state.decode.members[0]
        m.apply(Members((P0,), (D0,), frozenset({D0})))
        before = d0.generation
        m.apply(Members((P0,), (D0,)))
        assert not d0.draining and d0.generation > before and d0 in state.decode.healthy()
        for t in m.tasks():
            t.cancel()
        await asyncio.gather(*m.tasks(), return_exceptions=True)

    asyncio.run(run())
