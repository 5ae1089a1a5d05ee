"""Prefill and decode pools: health, load, and the two selection policies.

An upstream is ejected after `eject_after` consecutive failures of its health (health checks, connections
refused or reset) or at once when it dies mid-stream, and re-admitted by the first health check that passes. A
request's own 5xx answer is that request's answer, never a health failure; slowness (a read timeout) never
ejects the last healthy instance of a role. Every sign that the process may have died (refused, reset, a changed
engine id) starts a new `generation`: handles an earlier generation issued point at KV that no longer exists.
Selection is bounded-load:
    prefill  consistent hashing on the conversation (its prefix cache stays warm), skipping instances above
             load_factor x the mean outstanding load (Mirrokni et al., "Consistent Hashing with Bounded Loads")
    decode   the instance that holds the conversation's blocks (its prefix cache saves the P->D pull) while
             under the same cap, else the least outstanding one
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(eq=False)
class Upstream:
    url: str
    role: str
    healthy: bool = True
    outstanding: int = 0
    work: int = 0  # prompt tokens of its in-flight requests not yet computed (router.placement's estimate)
    work_done_at: float = 0.0  # time.perf_counter() when a prompt counted in `work` last finished (load.Work)
    failures: int = 0
    generation: int = 0
    engine_id: str | None = None
    draining: bool = False  # leaving the deployment: no new turns, its in-flight ones finish (members.py)


class Pool:
    def __init__(self, role: str, urls: Sequence[str], eject_after: int = 3) -> None:
        self.role = role
        self.members = [Upstream(u.rstrip("/"), role) for u in urls]
        self.eject_after = eject_after
        self.version = 0  # changes with the members (a policy built on them rebuilds)

    def healthy(self) -> list[Upstream]:
        """The members a new turn may go to: healthy and not draining."""
        return [u for u in self.members if u.healthy and not u.draining]

    def add(self, url: str) -> Upstream:
        u = Upstream(url.rstrip("/"), self.role)
        self.members.append(u)
        self.version += 1
        return u

    def remove(self, u: Upstream) -> None:
        self.members.remove(u)
        self.lost(u)  # a later member at the same URL is another process
        self.version += 1

    def by_url(self, url: str) -> Upstream | None:
        return next((u for u in self.members if u.url == url), None)

    def succeeded(self, u: Upstream) -> None:
        u.failures = 0
        u.healthy = True

    def failed(self, u: Upstream, slow: bool = False) -> None:
        """One failed health signal; `slow` (a timeout: the process answered nothing in time but may be alive)
        never ejects the role's last healthy instance, which would turn overload into an outage."""
        u.failures += 1
        if u.healthy and u.failures >= self.eject_after and not (slow and self.healthy() == [u]):
            u.healthy = False
            self.lost(u)

    def eject(self, u: Upstream) -> None:
        u.failures = max(u.failures + 1, self.eject_after)
        u.healthy = False
        self.lost(u)

    def lost(self, u: Upstream) -> None:
        """The process may have died (and been restarted): nothing it held before is trusted any more."""
        u.generation += 1

    def saw_engine(self, u: Upstream, engine_id: object) -> None:
        """An answer named the engine behind `u`; a different one than before is a restarted process."""
        if not isinstance(engine_id, str):
            return
        if u.engine_id is not None and u.engine_id != engine_id:
            self.lost(u)
        u.engine_id = engine_id


def load_cap(candidates: Sequence[Upstream], factor: float) -> int:
    """The most outstanding requests one instance may have before the next goes elsewhere."""
    total = sum(u.outstanding for u in candidates) + 1
    return max(1, math.ceil(factor * total / len(candidates)))


def least_loaded(candidates: Sequence[Upstream], turn: int = 0) -> Upstream:
    """The least outstanding instance; ties rotate with `turn` so idle instances share the work."""
    n = len(candidates)
    return min((candidates[(turn + i) % n] for i in range(n)), key=lambda u: u.outstanding)


class Selector(Protocol):
    def pick(self, pool: Pool, key: str, exclude: Collection[Upstream] = ()) -> Upstream | None: ...


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class AffinityRing:
    """Prefill policy: consistent hashing on the conversation id, bounded by load."""

    def __init__(self, pool: Pool, factor: float = 1.25, replicas: int = 64) -> None:
        self.factor = factor
        self.replicas = replicas
        self._build(pool)

    def _build(self, pool: Pool) -> None:
        # by URL, so a member added or removed moves only the conversations its points own
        points = sorted((_h(f"{u.url}#{i}"), n) for n, u in enumerate(pool.members) for i in range(self.replicas))
        self._hashes = [p for p, _ in points]
        self._owners = [n for _, n in points]
        self._version = pool.version

    def pick(self, pool: Pool, key: str, exclude: Collection[Upstream] = ()) -> Upstream | None:
        if self._version != pool.version:
            self._build(pool)
        candidates = [u for u in pool.healthy() if u not in exclude]
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        cap = load_cap(candidates, self.factor)
        start = bisect.bisect(self._hashes, _h(key))
        seen: set[int] = set()
        for i in range(len(self._owners)):
            n = self._owners[(start + i) % len(self._owners)]
            if n in seen:
                continue
            seen.add(n)
            u = pool.members[n]
            if u in candidates and u.outstanding < cap:
                return u
        return least_loaded(candidates)


class HolderFirst:
    """Decode policy: the instance holding the conversation's blocks if under the load cap, else least loaded.

    Its `key` is the URL of the decode that holds the blocks ("" when none does).
    """

    def __init__(self, factor: float = 1.25) -> None:
        self.factor = factor
        self._turn = 0

    def pick(self, pool: Pool, key: str, exclude: Collection[Upstream] = ()) -> Upstream | None:
        candidates = [u for u in pool.healthy() if u not in exclude]
        if not candidates:
            return None
        holder = next((u for u in candidates if u.url == key), None)
        if holder is not None and holder.outstanding < load_cap(candidates, self.factor):
            return holder
        self._turn += 1
        return least_loaded(candidates, self._turn)
