"""Aggregated mode's memory: which engine served each conversation's last turn (its prefix cache holds it), and
how a new conversation picks one.

One entry per conversation, bounded (least recently used go), with the engine's `generation` when it served the
turn: an engine that may have died since (upstream/pools.py) holds nothing of it any more, so the next turn picks
again. A derived conversation's entry carries the key its next request is matched by (conversation.py), kept in
step with the index as the handle table keeps it in disaggregated mode.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Hashable
from dataclasses import dataclass

from pdctl.router.kv.handles import KeyIndex
from pdctl.router.upstream.pools import Pool, Upstream


@dataclass(frozen=True, slots=True)
class Served:
    url: str
    generation: int
    derived_key: Hashable | None = None


class AffinityTable:
    def __init__(self, max_size: int, index: KeyIndex | None = None) -> None:
        self.max_size = max_size
        self.index = index
        self._last: OrderedDict[str, Served] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def get(self, cid: str) -> Served | None:
        return self._last.get(cid)

    def put(self, cid: str, u: Upstream, derived_key: Hashable | None = None) -> None:
        """`u` served the conversation's latest turn; `derived_key` matches its next request (None: keep the old)."""
        old = self._last.pop(cid, None)
        if derived_key is None and old is not None:
            derived_key = old.derived_key
        elif old is not None:
            self._discard(cid, old)
        self._last[cid] = Served(u.url, u.generation, derived_key)
        if self.index is not None and derived_key is not None:
            self.index.add(derived_key, cid)
        while len(self._last) > self.max_size:
            gone, served = self._last.popitem(last=False)
            self._discard(gone, served)

    def drop(self, cid: str) -> None:
        """Forget the conversation (its turns are served another way now)."""
        served = self._last.pop(cid, None)
        if served is not None:
            self._discard(cid, served)

    def _discard(self, cid: str, served: Served) -> None:
        if self.index is not None and served.derived_key is not None:
            self.index.discard(served.derived_key, cid)


class EngineChoice:
    """The engine for a request: the one that served its conversation's last turn while it is healthy and the
    same process, else the least loaded (requests in flight, then prompt tokens in flight); ties rotate."""

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, pool: Pool, last: Served | None, exclude: Collection[Upstream] = ()) -> Upstream | None:
        candidates = [u for u in pool.healthy() if u not in exclude]
        if not candidates:
            return None
        if last is not None:
            holder = next((u for u in candidates if u.url == last.url and u.generation == last.generation), None)
            if holder is not None:
                return holder
        self._turn += 1
        n = len(candidates)
        return min((candidates[(self._turn + i) % n] for i in range(n)), key=lambda u: (u.outstanding, u.work))
