"""Releases: freeing a decode's KV that no turn will read, with a one-token request to a prefill.

With bidirectional transfer a decode keeps every finished turn's blocks until a prefill reads them or its
`decoder_kv_blocks_ttl` (480 s) runs out; a conversation's last turn, and every handle the router drops, is never
read. vLLM 0.26.0 frees a decode's retained blocks early only on a prefill's NIXL notify, so a release is a tiny
completion to a prefill carrying the handle such that the prefill reads nothing and notifies the decode. In
tests/fixtures/vllm-0.26.0/.../nixl/pull_scheduler.py:

- `get_num_new_matched_tokens` (lines 71-110): with `do_remote_decode` true, the block ids and the four `remote_*`
  keys, the D->P count is `min(remote_num_tokens, num_prompt_tokens) - num_computed_tokens`; the release sends
  `remote_num_tokens` 0, so the count is 0 and the prefill returns `(0, False)`: nothing to read, no wait.
- `update_state_after_alloc` (lines 134-162): `do_remote_decode` + `is_bidirectional_kv_xfer_enabled` + not yet
  processed, with those keys present, puts the request in `_reqs_need_recv` with no local blocks ("a full prefix
  cache hit on the local node. We need to call send_notif in _read_blocks to free the memory on the remote node"):
  the decode frees the handle's blocks when that notify arrives (single use: pull_worker `_get_new_notifs`).
- `request_finished` (lines 203, 225-258): `is_p_node = do_remote_decode`, and a FINISHED_LENGTH_CAPPED request
  keeps its own blocks for a decode's pull until `kv_lease_duration` (30 s; no decode heartbeats it). Nothing in
  stock 0.26.0 avoids that for a request that notifies (do_remote_decode false skips the D->P branch;
  do_remote_prefill true makes the prefill pull as a decode would and then keep its blocks `decoder_kv_blocks_ttl`),
  so the release's prompt is one token id: the prefill computes one token and holds one block. pdctl's patch
  (pdctl.vllm_compat) frees that block at finish for a request marked `pdctl_release`, as `request_finished` frees
  an aborted one (`_reqs_not_processed`, `return False, None`); the notify went out when the request was scheduled.

Without pdctl's patch (`router.verify_at: router` on a stock vLLM) the decode is freed just the same: the release
carries no `pdctl_prefix` spec, `remote_num_tokens` 0 is read as it is, and the unknown `pdctl_release` key is
ignored; only the prefill's one block stays for `kv_lease_duration`. `remote_blocks_expiry_time` is left out, so
no prefill declines the notify as an expired read. tests/unit/test_vllm_compat_scheduler.py runs this request
through the fixture's real scheduler code, stock and patched.

Releases run in the background, `release_concurrency` at a time, never on a turn's path: a queue drained by at most
that many worker tasks, started when releases come and ended when the queue is empty (no task per release: the
steady state of a full handle table is one release per new conversation). Each goes to the least loaded healthy
prefill, and only while the handle's decode is healthy (a decode that is down has no side channel to notify). A
failed release logs a warning and counts; the handle is gone either way. A release stays in the pin journal
(journal.py) until it is done, so a router that dies with releases queued leaves them to the next one.

A release can also ride on a turn's own prefill request instead (`take`, prefill.py): a turn that reads nothing
from a decode (a miss: a new conversation, a recompute) sends the prefill the queued handle's params with
`remote_num_tokens` 0, and vLLM's scheduler treats them exactly as a release's (nothing to read: the count is at
most 0; the request goes to `_reqs_need_recv` with no local blocks, so the worker notifies the decode) while it
computes the turn's prompt as it would anyway, and answers with its own params for the decode's pull. No request is
added: where new conversations keep the handle table full, each carries the release of the handle it displaced. A
queued release waits `release_carry_ms` for such a turn before a worker sends it alone; a carrier that fails gives
it back to a worker (`carried`). A carried release is counted with result `carried`. Turns carry releases only to a
decode their prefill has already notified with a release of its own (`take`): the first contact on a pair is a
one-token request, which has finished by the time a failed NIXL handshake could be reported against it.

An evicted or expired handle's release waits longer while its decode is calm (`_next_due`): blocks nothing needs
are not worth a request of their own, and where traffic pauses the evictions of a burst's last turns (or a sweep's
expiries, in batches larger than a carry window's turns) would each go alone; the next new conversations carry
them instead. Pressure, a drain (`urgent`: a reset, a stopping router) or a close ends the wait.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from pdctl import prefix_check
from pdctl.defaults import VLLM_DECODER_KV_BLOCKS_TTL_S
from pdctl.kv_expiry import ENGINE_EXPIRY_MARGIN_S
from pdctl.router import jsonx
from pdctl.router.kv.handles import PRESSURE, RECLAIMED, REPLACED, SHUTDOWN, SINGLE_TURN, UNREAD, Handle, Pins
from pdctl.router.kv.pins import pinned_tokens
from pdctl.router.lean_metrics import Counter
from pdctl.router.upstream.client import LeanClient
from pdctl.router.upstream.pools import Pool, Upstream
from pdctl.router.wire import EVICTED, EXPIRED

log = logging.getLogger("pdctl.router")

CARRIED = "carried"  # a release's result when it rode on a turn's prefill request
# A pair (prefill, decode) counts as linked this long after its last release: well within vLLM's engine_ttl (3600 s
# without contact), after which a prefill forgets a decode's agent and would handshake again.
LINK_S = 600.0
TIMEOUT_S = 10.0  # a release waits this long for its prefill: it holds a slot of release_concurrency meanwhile
MAX_PENDING = 4096  # releases waiting for a slot; past it a release is counted failed (backlog) and not sent
PATIENT_MAX = 1024  # open releases past which none waits longer than release_carry_ms for a carrier, calm or not
PATIENT_REASONS = (EVICTED, EXPIRED)  # handles whose release may wait for a carrier while their decode is calm
CALM_RECHECK_S = 0.25  # a release waiting for a carrier looks again this often (its decode may no longer be calm)
# Marks a release for pdctl's patch to vLLM (pdctl.vllm_compat.edits): the prefill frees its block at finish.
RELEASE_FIELD = "pdctl_release"
SHOWN_REASONS = (PRESSURE, SINGLE_TURN, RECLAIMED, REPLACED, UNREAD, SHUTDOWN)  # exported from the start


def release_params(params: dict[str, Any], alone: bool = True) -> dict[str, Any]:
    """The handle's params as a release sends them: the D->P form, nothing to read, no expiry to check. `alone`:
    marked as a release of its own (a one-token request whose block the patched prefill frees at finish); a
    carried release is not marked (its request is a turn whose blocks the decode pulls)."""
    out = {k: v for k, v in params.items()
           if k not in ("remote_blocks_expiry_time", prefix_check.FIELD, prefix_check.REPORT)}
    out["do_remote_decode"] = True
    out["do_remote_prefill"] = False
    out["remote_num_tokens"] = 0
    if alone:
        out[RELEASE_FIELD] = True
    return out


def release_body(h: Handle, model: str) -> dict[str, Any]:
    """A one-token completion that makes a prefill notify `h`'s decode: the conversation's first token id when the
    router knows it (any id of the vocabulary does), else 0."""
    token = int(h.tokens[0]) if h.tokens else 0
    return {"model": model, "prompt": [token], "max_tokens": 1, "stream": False,
            "kv_transfer_params": release_params(h.params)}


class ReleaseMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.counter = Counter("pdctl_router_kv_releases", "Releases of decode KV no turn would read, by why the "
                               "handle was dropped and result (sent; carried: on a turn's own prefill request; "
                               "failed; skipped: its decode was down).",
                               ["reason", "result"], registry=registry)
        for reason in SHOWN_REASONS:  # at 0 from the start: a rate of them is 0, not absent, before the first
            self.counter.labels(reason, "sent")
        self.sent: Tally[str] = Tally()
        self.failed = 0
        self.results: Tally[tuple[str, str]] = Tally()  # (reason, result) -> releases
        self._children: dict[tuple[str, str], Any] = {}  # label children, looked up once

    def count(self, reason: str, result: str) -> None:
        child = self._children.get((reason, result))
        if child is None:
            child = self._children[(reason, result)] = self.counter.labels(reason, result)
        child.inc()
        self.results[(reason, result)] += 1
        if result in ("sent", CARRIED):
            self.sent[reason] += 1
        elif result == "failed":
            self.failed += 1


@dataclass(frozen=True, slots=True)
class Queued:
    """A release not yet sent: the handle, why it was dropped, the tokens it pins, when it was queued."""

    handle: Handle
    reason: str
    tokens: int
    at: float
    carriable: bool = True  # False: a turn carried it and failed; a worker sends it alone


class Releaser:
    """Sends releases in the background; `submit` is the handle table's `on_drop`."""

    def __init__(self, prefill: Pool, decode: Pool, model: str, metrics: ReleaseMetrics, concurrency: int,
                 enabled: bool = True, block_size: int = 1, carry_s: float = 0.0, calm_carry_s: float = 0.0,
                 engine_ttl_s: float = VLLM_DECODER_KV_BLOCKS_TTL_S) -> None:
        self.prefill, self.decode, self.model = prefill, decode, model
        self.client: LeanClient | None = None  # the router's, set by the app's lifespan
        self.metrics = metrics
        self.enabled = enabled
        self.concurrency = max(1, concurrency)
        self._queue: deque[Queued] = deque()  # not yet sent, oldest first
        self.carry_s = max(0.0, carry_s)  # how long a queued release waits for a turn to carry it
        self.calm_carry_s = max(0.0, calm_carry_s)  # how long an evicted handle waits while its decode is calm
        self.calm: Callable[[str], bool] | None = None  # decode URL -> whether its KV is calm (retention.py)
        self.engine_ttl_s = engine_ttl_s  # the decodes' decoder_kv_blocks_ttl: they free a handle's blocks then
        self._urgent = 0  # drains in progress: meanwhile no release waits for a carrier
        self._workers: set[asyncio.Task[None]] = set()
        # Workers draining the queue: one leaves this count in the same step as it finds the queue empty, so a
        # release submitted after that step starts a worker (the task set's done callback comes a step later).
        self._running = 0
        self._open = 0  # releases submitted and not yet done (queued or being sent)
        self.pending: Tally[str] = Tally()  # decode URL -> its releases not yet done (a drain waits for 0)
        self.pending_tokens: Tally[str] = Tally()  # decode URL -> the tokens those releases will free (whole blocks)
        self.block_size = block_size
        self.journal: Pins | None = None  # the pin journal (journal.py), set where the router keeps one
        self._idle = asyncio.Event()
        self._closed = False
        # (prefill URL, decode URL) -> (the prefill's and the decode's generations, when) of the last release through
        # that prefill to that decode: a turn carries releases only on such a pair (see `take`).
        self._links: dict[tuple[str, str], tuple[int, int, float]] = {}

    @property
    def queued(self) -> int:
        """Releases submitted and not yet done (bounded by MAX_PENDING)."""
        return self._open

    def submit(self, h: Handle, reason: str) -> None:
        if not self.enabled or self.client is None:
            return
        loop = None
        if self._running < self.concurrency:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a table used outside the router): nothing can be sent
                return
        if self._open >= MAX_PENDING:
            self.metrics.count(reason, "failed")
            log.warning("release backlog full (%d): the blocks of a %s handle stay pinned on %s until its TTL",
                        MAX_PENDING, reason, h.decode_url)
            return
        tokens = pinned_tokens(h.num_tokens, self.block_size)
        self._queue.append(Queued(h, reason, tokens, time.monotonic()))
        self._open += 1
        self._idle.clear()
        self.pending[h.decode_url] += 1
        self.pending_tokens[h.decode_url] += tokens
        if self.journal is not None:
            self.journal.pin(h)
        if loop is not None:
            self._start(loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._running += 1
        worker = loop.create_task(self._work())
        self._workers.add(worker)
        worker.add_done_callback(self._workers.discard)

    async def _work(self) -> None:
        """Send queued releases one after the other until none is left, each once it has waited `carry_s` for a
        turn to carry it."""
        try:
            while self._queue:
                i, wait = self._next_due()
                if i is None:
                    await asyncio.sleep(min(wait, CALM_RECHECK_S))
                    continue  # a turn may have taken it meanwhile, or its decode be calm no longer
                q = self._queue[i]
                del self._queue[i]
                done = False
                try:
                    done = await self._send(q.handle, q.reason)
                except Exception:  # a bug, not the network (_send handles that): the release stays in the journal
                    log.exception("release of a %s handle on %s failed", q.reason, q.handle.decode_url)
                finally:  # cancelled (the router stopped): not done either
                    self._done(q.handle, q.tokens, done)
        finally:
            self._running -= 1

    def _next_due(self) -> tuple[int | None, float]:
        """The index of the oldest queued release done waiting for a carrier, or None and how long until the first
        is. A release waits `carry_s`; an evicted or expired handle's, while its decode is calm (retention.py) on a
        linked pair with at most PATIENT_MAX open, up to `calm_carry_s` but not past ENGINE_EXPIRY_MARGIN_S before
        the decode's TTL frees the blocks (a notify then finds nothing); none during a drain, after a failed carrier
        or once closed. One waiting holds back none behind it; the queue is in the order of `at`, so the scan ends
        at the first release still inside its `carry_s`."""
        if self._closed or self._urgent or self.carry_s <= 0:
            return (0, 0.0) if self._queue else (None, 0.0)
        now, soonest = time.monotonic(), float("inf")
        patient = self.calm_carry_s > self.carry_s and self._open <= PATIENT_MAX and self.calm is not None
        calm: dict[str, bool] = {}  # decode URL -> whether releases there may wait longer (looked up once a scan)
        for i, q in enumerate(self._queue):
            if not q.carriable:
                return i, 0.0
            first = q.at + self.carry_s - now
            if first > 0:
                return None, min(soonest, first)
            if not patient or q.reason not in PATIENT_REASONS:
                return i, 0.0
            h = q.handle
            ok = calm.get(h.decode_url)
            if ok is None:
                ok = calm[h.decode_url] = self._linked(h.decode_url) and bool(self.calm and self.calm(h.decode_url))
            if not ok:
                return i, 0.0
            wait = q.at + min(self.calm_carry_s, h.received + self.engine_ttl_s - ENGINE_EXPIRY_MARGIN_S - q.at) - now
            if wait <= 0:
                return i, 0.0
            soonest = min(soonest, wait)
        return None, soonest

    def _linked(self, decode_url: str) -> bool:
        """Whether some prefill was linked to this decode within LINK_S (a turn to it can carry a release)."""
        now = time.monotonic()
        return any(d == decode_url and now - link[2] <= LINK_S for (_, d), link in self._links.items())

    @contextmanager
    def urgent(self) -> Iterator[None]:
        """Meanwhile no release waits for a carrier: those queued go as soon as a worker gets to them."""
        self._urgent += 1
        try:
            yield
        finally:
            self._urgent -= 1

    def take(self, p: Upstream) -> Queued | None:
        """The oldest queued release a turn's prefill request to `p` can carry, for `carried` to settle once that
        request is answered; None: nothing to carry. Releases whose decode is gone are settled here as skipped, as
        a worker would.

        Only on a linked pair: a release of its own went through that prefill to that decode (both in this
        incarnation) within LINK_S, so the prefill's NIXL agent already knows the decode. A first contact starts a
        handshake, and in vLLM 0.26.0 a failed one reports the request as done receiving, which the scheduler
        accepts only of a request waiting for KV or finished (`_update_from_kv_xfer_finished` asserts it): a
        one-token release has finished by then, a turn computing its prompt may not have."""
        if self.carry_s <= 0:
            return None
        now = time.monotonic()
        while self._queue and self._queue[0].carriable:
            q = self._queue[0]
            d = self.decode.by_url(q.handle.decode_url)
            if d is None or not d.healthy or d.generation != q.handle.generation:
                self._queue.popleft()
                self.metrics.count(q.reason, "skipped")
                self._done(q.handle, q.tokens, True)
                continue
            link = self._links.get((p.url, d.url))
            if link is None or link[:2] != (p.generation, d.generation) or now - link[2] > LINK_S:
                return None  # the worker sends it alone, which links the pair for the next ones
            self._queue.popleft()
            return q
        return None

    def carried(self, q: Queued, p: Upstream, sent: bool) -> None:
        """What became of a release a turn carried: sent (its prefill answered 200: the decode was notified when the
        request was scheduled), or not (refused, failed, unreachable: whether the notify went out is unknown). Then
        it goes back to the front of the queue for a worker to send alone, at once and never carried again: a
        second notify of a handle already freed is only logged by the decode, a handle left pinned holds its blocks
        until the decode's TTL."""
        if sent:
            self.metrics.count(q.reason, CARRIED)
            self._links[p.url, q.handle.decode_url] = (p.generation, q.handle.generation, time.monotonic())
            self._done(q.handle, q.tokens, True)
            return
        if self._closed:  # the router stopped: it stays in the journal for the next one
            self._done(q.handle, q.tokens, False)
            return
        self._queue.appendleft(replace(q, carriable=False))
        if self._running < self.concurrency:
            self._start(asyncio.get_running_loop())

    def _done(self, h: Handle, tokens: int, done: bool) -> None:
        url = h.decode_url
        self._open -= 1
        self.pending[url] -= 1
        if self.pending[url] <= 0:
            del self.pending[url]
        self.pending_tokens[url] -= tokens
        if self.pending_tokens[url] <= 0:
            del self.pending_tokens[url]
        # A release cancelled (the router stopped) or failed (no prefill took it) stays in the journal: the next
        # router tries it again, unless the decode's TTL has freed the blocks by then.
        if self.journal is not None and done:
            self.journal.unpin(h)
        if not self._open:
            self._idle.set()

    async def drained(self, timeout: float) -> bool:
        """Wait until no release is left (at most `timeout` seconds); whether none is."""
        if not self._open:
            return True
        with self.urgent():
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except TimeoutError:
                return not self._open
        return True

    async def _send(self, h: Handle, reason: str) -> bool:
        """Whether the release is done with (sent, or nothing left to release); False: it failed."""
        d = self.decode.by_url(h.decode_url)
        if d is None or not d.healthy or d.generation != h.generation:
            self.metrics.count(reason, "skipped")
            return True
        ups = self.prefill.healthy()
        if not ups:
            self._failed(h, reason, "no healthy prefill")
            return False
        p = min(ups, key=lambda u: u.outstanding)
        client = self.client
        assert client is not None
        url, body = f"{p.url}/v1/completions", jsonx.dumps(release_body(h, self.model))
        headers = {"content-type": "application/json", "x-request-id": f"release-{os.urandom(16).hex()}"}
        try:
            status = (await client.post_whole(url, body, headers, TIMEOUT_S)).status_code
        except httpx.HTTPError as e:
            self._failed(h, reason, f"{p.url}: {type(e).__name__}")
            return False
        if status != 200:
            self._failed(h, reason, f"{p.url} answered {status}")
            return False
        self.metrics.count(reason, "sent")
        self._links[p.url, h.decode_url] = (p.generation, h.generation, time.monotonic())
        return True

    def _failed(self, h: Handle, reason: str, why: str) -> None:
        self.metrics.count(reason, "failed")
        log.warning("release of a %s handle on %s failed (%s): its blocks stay pinned until the decode's TTL",
                    reason, h.decode_url, why)

    async def close(self) -> None:
        self._closed = True
        self._queue.clear()  # never sent: they stay in the journal for the next router
        for t in list(self._workers):
            t.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
