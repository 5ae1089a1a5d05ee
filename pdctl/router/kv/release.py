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
prefill, and only while the handle's decode is healthy (a decode that is down has no side channel to
notify). A failed release logs a warning and counts; the handle is gone either way. A release stays in the pin
journal (journal.py) until it is done, so a router that dies with releases queued leaves them to the next one.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter as Tally
from collections import deque
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from pdctl import prefix_check
from pdctl.router import jsonx
from pdctl.router.kv.handles import PRESSURE, RECLAIMED, REPLACED, SHUTDOWN, SINGLE_TURN, UNREAD, Handle, Pins
from pdctl.router.kv.pins import pinned_tokens
from pdctl.router.lean_metrics import Counter
from pdctl.router.upstream.client import LeanClient
from pdctl.router.upstream.pools import Pool

log = logging.getLogger("pdctl.router")

TIMEOUT_S = 10.0  # a release waits this long for its prefill: it holds a slot of release_concurrency meanwhile
MAX_PENDING = 4096  # releases waiting for a slot; past it a release is counted failed (backlog) and not sent
# Marks a release for pdctl's patch to vLLM (pdctl.vllm_compat.edits): the prefill frees its block at finish.
RELEASE_FIELD = "pdctl_release"
SHOWN_REASONS = (PRESSURE, SINGLE_TURN, RECLAIMED, REPLACED, UNREAD, SHUTDOWN)  # exported from the start


def release_params(params: dict[str, Any]) -> dict[str, Any]:
    """The handle's params as a release sends them: the D->P form, nothing to read, no expiry to check."""
    out = {k: v for k, v in params.items()
           if k not in ("remote_blocks_expiry_time", prefix_check.FIELD, prefix_check.REPORT)}
    out["do_remote_decode"] = True
    out["do_remote_prefill"] = False
    out["remote_num_tokens"] = 0
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
                               "handle was dropped and result (sent, failed, skipped: its decode was down).",
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
        if result == "sent":
            self.sent[reason] += 1
        elif result == "failed":
            self.failed += 1


class Releaser:
    """Sends releases in the background; `submit` is the handle table's `on_drop`."""

    def __init__(self, prefill: Pool, decode: Pool, model: str, metrics: ReleaseMetrics, concurrency: int,
                 enabled: bool = True, block_size: int = 1) -> None:
        self.prefill, self.decode, self.model = prefill, decode, model
        self.client: LeanClient | None = None  # the router's, set by the app's lifespan
        self.metrics = metrics
        self.enabled = enabled
        self.concurrency = max(1, concurrency)
        self._queue: deque[tuple[Handle, str, int]] = deque()  # (handle, reason, its pinned tokens) not yet sent
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
        self._queue.append((h, reason, tokens))
        self._open += 1
        self._idle.clear()
        self.pending[h.decode_url] += 1
        self.pending_tokens[h.decode_url] += tokens
        if self.journal is not None:
            self.journal.pin(h)
        if loop is not None:
            self._running += 1
            worker = loop.create_task(self._work())
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)

    async def _work(self) -> None:
        """Send queued releases one after the other until none is left."""
        try:
            while self._queue:
                h, reason, tokens = self._queue.popleft()
                done = False
                try:
                    done = await self._send(h, reason)
                except Exception:  # a bug, not the network (_send handles that): the release stays in the journal
                    log.exception("release of a %s handle on %s failed", reason, h.decode_url)
                finally:  # cancelled (the router stopped): not done either
                    self._done(h, tokens, done)
        finally:
            self._running -= 1

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
        return True

    def _failed(self, h: Handle, reason: str, why: str) -> None:
        self.metrics.count(reason, "failed")
        log.warning("release of a %s handle on %s failed (%s): its blocks stay pinned until the decode's TTL",
                    reason, h.decode_url, why)

    async def close(self) -> None:
        self._queue.clear()  # never sent: they stay in the journal for the next router
        for t in list(self._workers):
            t.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
