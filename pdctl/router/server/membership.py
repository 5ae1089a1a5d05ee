"""Live membership: the members file applied to a running router, at start and on every SIGHUP.

A new member joins its pool (and, a decode, gets its tripwire); a draining one takes no new turn, its in-flight
turns finish, and a decode's live handles are released at once (their next turns miss, `released`: the KV they
point at is about to go). A member the file leaves out is removed once nothing is in flight on it. Nothing else
changes: the listener, open connections, other members and their handles stay as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from pdctl.errors import PdctlError
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream import members, tripwire
from pdctl.router.upstream.pools import Pool, Upstream
from pdctl.router.wire import RELEASED

log = logging.getLogger("pdctl.router")
DRAINED = "drained"  # the release reason of a draining decode's handles


class Membership:
    def __init__(self, state: RouterState) -> None:
        self.state = state
        self.leaving: set[str] = set()  # URLs the file left out, removed once idle
        self._wires: dict[str, asyncio.Task[None]] = {}
        self._prune: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Read the file (where there is one), start the tripwires, and reload on SIGHUP from now on."""
        path = self.state.config.members_file
        if path:
            self.reload()
            with contextlib.suppress(NotImplementedError, RuntimeError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)
        for u in self.state.decode.members:
            self._wire(u)
        self._prune = asyncio.create_task(self._prune_loop())

    def reload(self) -> None:
        path = self.state.config.members_file
        if not path:
            return
        try:
            found = members.read(path)
        except PdctlError as exc:  # a bad file changes nothing; the router goes on with what it has
            log.error("members file not applied: %s", exc.message)
            return
        if found is None:
            return
        if not found.decode or (not found.prefill and self.state.config.mode == "disaggregated"):
            log.error("members file %s not applied: it needs at least one prefill and one decode", path)
            return
        self.apply(found)

    def apply(self, m: members.Members) -> None:
        s = self.state
        for pool, urls in ((s.prefill, m.prefill), (s.decode, m.decode)):
            wanted = set(urls)
            for url in urls:
                u = pool.by_url(url)
                if u is None:
                    u = pool.add(url)
                    log.info("%s %s joined", pool.role, url)
                    if pool is s.decode:
                        self._wire(u)
                self.leaving.discard(url)
                self._set_draining(pool, u, url in m.draining)
            for u in [u for u in pool.members if u.url not in wanted]:
                self.leaving.add(u.url)
                self._set_draining(pool, u, True)
        self.prune()
        s.prefill_gate.wake()
        s.decode_gate.wake()

    def _set_draining(self, pool: Pool, u: Upstream, draining: bool) -> None:
        if draining and not u.draining:
            u.draining = True
            n = self.state.handles.drop_decode(u.url, DRAINED, RELEASED) if pool is self.state.decode else 0
            log.info("%s %s draining: no new turns; %d handle(s) released", pool.role, u.url, n)
        elif not draining and u.draining:
            u.draining = False
            pool.lost(u)  # back from a drain, perhaps restarted: nothing from before is trusted
            log.info("%s %s back in the pool", pool.role, u.url)

    def prune(self) -> None:
        """Remove the members the file left out that nothing is in flight on any more."""
        s = self.state
        for pool in (s.prefill, s.decode):
            for u in [u for u in pool.members if u.url in self.leaving]:
                if u.outstanding or (pool is s.decode and s.held().get(u.url)):
                    continue
                pool.remove(u)
                s.rates.forget(u.url)  # the cost model's rates of it and of its pairs (bounded by the members)
                self.leaving.discard(u.url)
                wire = self._wires.pop(u.url, None) if pool is s.decode else None
                if wire is not None:
                    wire.cancel()
                log.info("%s %s left", pool.role, u.url)

    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(min(self.state.config.health_interval, 0.5))
            if self.leaving:
                self.prune()

    def _wire(self, u: Upstream) -> None:
        interval = min(self.state.config.health_interval, 0.5)
        self._wires[u.url] = asyncio.create_task(tripwire.watch(self.state.decode, u, interval))

    def tasks(self) -> list[asyncio.Task[None]]:
        return [*self._wires.values(), *([self._prune] if self._prune else [])]
