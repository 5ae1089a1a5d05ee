"""Retained KV yields to new work: the router judges its pins against what each decode actually holds.

A decode keeps every finished turn's blocks for the conversation's next turn (bidirectional transfer), and those
count against the KV its running requests need. The router's pin budget (pins.py) counts only its own handles;
a decode also holds what other routers pinned, what an earlier router left, and whatever its running requests use.
So the router polls each decode's own /metrics a few times a second (vLLM's `vllm:kv_cache_usage_perc`, older
`vllm:gpu_cache_usage_perc`, and `vllm:num_requests_waiting`; the simulator exposes the same names) and:

- above `retain_high_kv` of its KV, releases its retained handles there until the decode is back at
  `retain_target_kv` (the tokens to free are (use - target) x capacity, less the releases already on their way);
- with requests waiting on a decode above `retain_target_kv`, does the same: a request that waits while the KV
  holds blocks kept for turns that may never come is what this exists to prevent. Waiting on a decode with KV to
  spare is a queue for compute, which releasing would not shorten.

Handles go least valuable first (handles.HandleTable.shed): a conversation that never took a second turn, then the
oldest, then the shortest. And while a poll finds requests waiting on a decode above `retain_target_kv`, a
conversation that never continued is not kept there at all: its handle is released as soon as the decode answers
(reason `pressure`), one release per new conversation, which the next one's prefill request carries, rather than in
the next poll's batch (polls every POLL_S; a batch larger than the new conversations of a carry window goes alone).
A turn whose handle was released is a miss (`released`), never wrong KV: the handle is gone from the table before
its release is sent.

A turn the router can tell is its conversation's last is not retained at all: its KV is released as soon as the
decode answers (reason `single_turn`): a request with `X-PD-Retain: no` (also `0`, `false`), and a request that
belongs to no conversation (nothing could ever continue it).

The same poll feeds the /stats retention section and the /metrics gauges: each decode's KV use, requests waiting,
blocks and tokens this router's handles pin there; the handles held, the release queue, releases by reason.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry, Gauge

from pdctl.router.kv.handles import RECLAIMED, SHUTDOWN, HandleTable
from pdctl.router.kv.journal import Journal, Pinned
from pdctl.router.kv.pins import kv_capacity
from pdctl.router.kv.release import Releaser
from pdctl.router.upstream.pools import Pool
from pdctl.router.wire import DecodeRetention, RetentionStats

log = logging.getLogger("pdctl.router")

POLL_S = 0.25
FLUSH_S = 0.25  # the journal's appends: a router killed between two loses at most this much of its record
CALM_AGE_S = 4 * POLL_S  # a poll older than this (the decode slow to answer, or gone) says nothing of its calm
SQUEEZE_S = 4 * POLL_S  # a poll's finding of requests waiting for KV counts this long (polls that fail: not longer)
UNKNOWN_CAPACITY_BATCH = 8  # handles released per poll under pressure on a decode that does not say its capacity
RETAIN_HEADER = b"x-pd-retain"
NO = (b"no", b"0", b"false", b"off")
_USAGE = re.compile(r"^vllm:(?:kv_cache_usage_perc|gpu_cache_usage_perc)(?:\{[^}]*\})?\s+(\S+)", re.M)
_WAITING = re.compile(r"^vllm:num_requests_waiting(?:\{[^}]*\})?\s+(\S+)", re.M)


def single_turn(headers: list[tuple[bytes, bytes]]) -> bool:
    """The client says this turn is its conversation's last (`X-PD-Retain: no`): keep nothing of it."""
    for k, v in headers:
        if k == RETAIN_HEADER:
            return v.strip().lower() in NO
    return False


def _floats(pattern: re.Pattern[str], text: str) -> list[float]:
    out = []
    for v in pattern.findall(text):
        try:
            out.append(float(v))
        except ValueError:
            continue
    return out


@dataclass(frozen=True, slots=True)
class DecodeKv:
    """What a decode's /metrics said at the last poll."""

    usage: float | None  # 0..1 (the fullest of its label sets); None: it does not say
    waiting: int
    capacity: int | None  # tokens
    at: float  # monotonic time of the poll


def read_decode_kv(text: str, at: float) -> DecodeKv:
    usage = _floats(_USAGE, text)
    return DecodeKv(max(usage) if usage else None, int(sum(_floats(_WAITING, text))), kv_capacity(text), at)


class RetentionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.usage = Gauge("pdctl_router_decode_kv_usage", "The decode's KV use (0..1) from its own /metrics, as "
                           "the router last polled it (retention: what retained KV is judged against).", ["index"],
                           registry=r)
        self.waiting = Gauge("pdctl_router_decode_waiting", "Requests waiting on the decode (its "
                             "vllm:num_requests_waiting) at the router's last poll.", ["index"], registry=r)
        self.retained = Gauge("pdctl_router_retained_blocks", "KV blocks this router's live handles pin on the "
                              "decode.", ["index"], registry=r)
        self.handles = Gauge("pdctl_router_retained_handles", "This router's live handles on the decode (each pins "
                             "a conversation's KV there for its next turn).", ["index"], registry=r)
        self.capacity = Gauge("pdctl_router_decode_kv_capacity_blocks", "The decode's KV blocks in all (its "
                              "vllm:cache_config_info, as the router last polled it): what retained blocks are "
                              "judged against.", ["index"], registry=r)
        self.queue = Gauge("pdctl_router_release_queue", "Releases submitted and not yet done.", registry=r)
        self.journal = Gauge("pdctl_router_journal_pins", "Pins in this router's journal (live handles and "
                             "releases not yet done).", registry=r)


class Retention:
    def __init__(self, table: HandleTable, releaser: Releaser, decode: Pool, high: float, target: float,
                 block_size: int, registry: CollectorRegistry, journal: Journal | None = None) -> None:
        self.table, self.releaser, self.decode = table, releaser, decode
        self.high, self.target = high, target
        self.block_size = block_size
        self.journal = journal
        self.metrics = RetentionMetrics(registry)
        self.seen: dict[str, DecodeKv] = {}
        self.pressure_events = 0  # polls that found a decode under pressure and released something
        self._waiting: dict[str, float] = {}  # decode URL -> when a poll last found requests waiting for its KV

    @property
    def enabled(self) -> bool:
        return self.high > 0 and self.releaser.enabled

    # --- under pressure --------------------------------------------------------------------------------------
    def judge(self, url: str, kv: DecodeKv) -> int:
        """Release this router's handles on the decode at `url` if its KV is under pressure; return how many."""
        if not self.enabled or kv.usage is None:
            return 0
        waiting = kv.waiting > 0 and kv.usage > self.target
        if waiting:
            self._waiting[url] = kv.at
        else:
            self._waiting.pop(url, None)
        over = kv.usage > self.high or waiting
        if not over or not self.table.on(url):
            return 0
        if kv.capacity:
            need = int((kv.usage - self.target) * kv.capacity) - self.releaser.pending_tokens[url]
            if need <= 0:
                return 0
            gone = self.table.shed(url, need)
        elif self.releaser.pending[url]:
            return 0  # no capacity to size it by: one batch at a time, judged again once it is done
        else:
            gone = self.table.shed(url, 0, most=UNKNOWN_CAPACITY_BATCH)
        if gone:
            self.pressure_events += 1
            log.info("decode %s at %.1f%% KV with %d waiting: released %d retained handle(s)", url,
                     100 * kv.usage, kv.waiting, gone)
        return gone

    def calm(self, url: str) -> bool:
        """Whether the decode at `url` has KV to spare: a poll at most CALM_AGE_S ago found it at or below
        `retain_target_kv` with nothing waiting. A release of a handle evicted or expired there may then wait longer
        for a turn to carry it (release.py); unknown (no recent poll, no usage reported, retention off) is not
        calm."""
        kv = self.seen.get(url)
        return (self.enabled and kv is not None and kv.usage is not None and kv.usage <= self.target
                and kv.waiting == 0 and time.monotonic() - kv.at <= CALM_AGE_S)

    def squeezed(self, url: str) -> bool:
        """Whether the last poll of the decode at `url`, at most SQUEEZE_S ago, found requests waiting for its KV
        (above retain_target_kv): a conversation's first turn then keeps nothing there (turn/keep.py)."""
        at = self._waiting.get(url)
        return at is not None and time.monotonic() - at <= SQUEEZE_S

    async def poll(self, url: str, client: httpx.AsyncClient, timeout: float) -> None:
        try:
            resp = await client.get(f"{url}/metrics", timeout=timeout)
        except httpx.HTTPError:
            return
        if resp.status_code != 200:
            return
        kv = read_decode_kv(resp.text, time.monotonic())
        self.seen[url] = kv
        self.judge(url, kv)

    async def loop(self, client: httpx.AsyncClient, timeout: float) -> None:
        while True:
            urls = [u.url for u in self.decode.members if u.healthy]
            for gone in self.seen.keys() - {u.url for u in self.decode.members}:
                del self.seen[gone]
            await asyncio.gather(*(self.poll(url, client, timeout) for url in urls))
            self.gauges()
            await asyncio.sleep(POLL_S)

    async def flush_loop(self) -> None:
        failing = False
        while self.journal is not None:
            try:
                self.journal.flush()
            except OSError as exc:  # a full disk, a removed directory: the router goes on, unrecorded
                if not failing:
                    log.warning("pin journal %s: cannot write it (%s); pins are not recorded until it can",
                                self.journal.path, exc)
                failing = True
            else:
                if failing:
                    log.info("pin journal %s: writing again", self.journal.path)
                failing = False
            await asyncio.sleep(FLUSH_S)

    # --- start and stop ----------------------------------------------------------------------------------------
    def reclaim(self, pins: dict[tuple[str, str], Pinned]) -> int:
        """Release what earlier routers pinned (journal.Journal.open took their journals); return how many went."""
        now, sent = self.table.clock(), 0
        for pin in pins.values():
            u = self.decode.by_url(pin.decode_url)
            if u is None:
                self.releaser.metrics.count(RECLAIMED, "skipped")
                log.info("an earlier router's pin on %s: not one of this router's decodes, left to its TTL",
                         pin.decode_url)
                continue
            self.releaser.submit(pin.handle(u.generation, now), RECLAIMED)
            sent += 1
        if self.journal is not None:
            self.journal.flush()  # the taken-over pins are this router's record now
        if pins:
            log.info("releasing %d pin(s) earlier routers of the deployment left on the decodes", sent)
        return sent

    async def shutdown(self, timeout: float) -> None:
        """The router stops on purpose: release every pin it holds, waiting at most `timeout` seconds."""
        if timeout <= 0 or not self.releaser.enabled:
            return
        n = self.table.drop_all(SHUTDOWN)
        if n or self.releaser.queued:
            log.info("stopping: releasing %d retained handle(s) (%d releases queued)", n, self.releaser.queued)
        if not await self.releaser.drained(timeout):
            log.warning("stopping: %d release(s) not done after %gs; they stay in the journal for the next router",
                        self.releaser.queued, timeout)

    # --- what it shows -----------------------------------------------------------------------------------------
    def gauges(self) -> None:
        pinned = self.table.pinned()
        m = self.metrics
        for i, u in enumerate(self.decode.members):
            index = str(i)
            kv = self.seen.get(u.url)
            if kv is not None and kv.usage is not None:
                m.usage.labels(index).set(kv.usage)
            if kv is not None:
                m.waiting.labels(index).set(kv.waiting)
            m.retained.labels(index).set(-(-pinned.get(u.url, 0) // self.block_size))
            m.handles.labels(index).set(self.table.on(u.url))
            if kv is not None and kv.capacity is not None:
                m.capacity.labels(index).set(kv.capacity // self.block_size)
        m.queue.set(self.releaser.queued)
        if self.journal is not None:
            m.journal.set(len(self.journal))

    def stats(self) -> RetentionStats:
        """The /stats `retention` section."""
        pinned = self.table.pinned()
        decodes = []
        for u in self.decode.members:
            kv = self.seen.get(u.url)
            tokens = pinned.get(u.url, 0)
            decodes.append(DecodeRetention(
                u.url, round(kv.usage, 4) if kv is not None and kv.usage is not None else None,
                kv.waiting if kv is not None else None, kv.capacity if kv is not None else None,
                -(-tokens // self.block_size), tokens, self.table.on(u.url), self.releaser.pending[u.url]))
        releases: dict[str, dict[str, int]] = {}
        for (reason, result), n in sorted(self.releaser.metrics.results.items()):
            releases.setdefault(reason, {})[result] = n
        return RetentionStats(self.high, self.target, len(self.table), self.releaser.queued, self.pressure_events,
                              releases, self.journal.stats() if self.journal is not None else None, tuple(decodes))
