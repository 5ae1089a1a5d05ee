"""NIXL-connector behaviour: blocks kept for a peer (lease on P, TTL on D), the side channel that serves
reads of them (single use), and the initiator's remote read with its expiry check and fault injection.

Nothing here costs more per request as requests are retained, in flight or finished (a simulator that slows with
time makes every capacity result from it wrong):

- Retained blocks expire through a heap of deadlines (pushed on retain, popped when due), never a scan of what is
  retained; entries already released stay in the heap until popped or until it is rebuilt, which happens once it
  holds twice what is retained (amortised O(1) per release).
- Each peer's side channel is its own HTTP client with at most `SIDE_CHANNEL_IN_FLIGHT` requests (and so
  connections) at a time: a shared pool with hundreds of requests queued rescans them all on every assignment.
  Its transport is pdctl.fasthttp's, not httpx's own, which polls every idle connection's socket before each
  request (the pulls' HTTP was half of a zero-delay decode's CPU).
- Notifies are queued per peer and sent in batches (one request carrying up to `NOTIFY_BATCH` request ids) by one
  task per peer, which the reader owns and awaits on close; vLLM's `send_notif` likewise never makes the request
  wait for the peer. The task lingers `NOTIFY_LINGER_S` before each batch so that notifies arriving a few ms apart
  share one HTTP request: a NIXL notify is a small message, an HTTP request costs this process about 0.3 ms of
  CPU, which at zero delay set the simulated prefill's rate once every new conversation carried a release.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from pdctl.fasthttp import FastTransport
from pdctl.sim.blocks import BlockPool
from pdctl.sim.metrics import SimMetrics

log = logging.getLogger("vllm.distributed.kv_transfer.kv_connector.v1.nixl")

# P declines a D->P read whose handle expires within this many seconds (pull_scheduler).
EXPIRY_MARGIN_S = 5.0
HANDLE_KEYS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")
SIDE_CHANNEL_IN_FLIGHT = 8  # requests (and connections) to one peer's side channel at a time
NOTIFY_BATCH = 256  # request ids per notify request
NOTIFY_LINGER_S = 0.05  # how long notifies gather before a batch goes (a decode frees the blocks this much later)
HEAP_SLACK = 1024  # released entries the expiry heap may hold beyond twice what is retained


class ReadFailed(Exception):
    """A remote KV read did not deliver blocks (the connector's failed-transfer path)."""


@dataclass
class Retained:
    request_id: str
    block_ids: list[int]
    deadline: float  # perf_counter, the clock vLLM advertises in remote_blocks_expiry_time
    kind: str  # "lease" (P, for D's pull) or "ttl" (D, for P's readback)
    seq: int = 0  # which heap entry is this one's (a request id retained again gets a new one)


def is_handle(params: dict[str, Any]) -> bool:
    groups = params.get("remote_block_ids")
    return bool(groups) and all(params.get(k) is not None for k in HANDLE_KEYS)


def block_group(params: dict[str, Any]) -> list[int]:
    """Group 0 of `remote_block_ids` (very old versions sent one flat list)."""
    groups = params.get("remote_block_ids") or []
    first = groups[0] if groups and isinstance(groups[0], list) else groups
    return [int(b) for b in first]


class KVStore:
    """The blocks this engine keeps for peers, served over its side channel.

    As vLLM's NIXL connector: a finished request whose blocks a peer will read keeps them (the scheduler's
    `_free_request` does not free them while `request_finished` returns `delay_free_blocks`; the worker lists the
    request in `_reqs_to_send` with a deadline, `time.perf_counter() + VLLM_NIXL_ABORT_REQUEST_TIMEOUT`, 480 s, or
    the bidirectional fork's `decoder_kv_blocks_ttl` / `kv_lease_duration`), so they stay allocated and count in
    `vllm:kv_cache_usage_perc` until the peer's read or notify (`_get_new_notifs`) or that deadline
    (`get_finished`) frees them."""

    def __init__(self, pool: BlockPool, engine_id: str, on_free: Callable[[str, int], None] | None = None) -> None:
        self.pool = pool
        self.engine_id = engine_id
        self.retained: dict[str, Retained] = {}
        self.retained_blocks = 0
        self.heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count(1)
        self.on_free = on_free  # (how: expired | read | released, requests), for the metrics

    def retain(self, request_id: str, block_ids: list[int], seconds: float, kind: str) -> float:
        deadline = time.perf_counter() + seconds
        if request_id in self.retained:  # the same id retained again: the older blocks are no longer reachable
            self.release(request_id, "released")
        entry = Retained(request_id, block_ids, deadline, kind, next(self._seq))
        self.retained[request_id] = entry
        self.retained_blocks += len(block_ids)
        heapq.heappush(self.heap, (deadline, entry.seq, request_id))
        return deadline

    def release(self, request_id: str, how: str = "released") -> bool:
        entry = self.retained.pop(request_id, None)
        if entry is None:
            return False
        self.retained_blocks -= len(entry.block_ids)
        self.pool.free_blocks(entry.block_ids)
        if self.on_free is not None:
            self.on_free(how, 1)
        self._compact()
        return True

    def _compact(self) -> None:
        """Rebuild the heap from what is retained once it holds more than twice that plus HEAP_SLACK: after every
        retain, release and sweep the heap is within that bound, at O(1) amortised per release."""
        if len(self.heap) > 2 * len(self.retained) + HEAP_SLACK:
            self.heap = [(e.deadline, e.seq, e.request_id) for e in self.retained.values()]
            heapq.heapify(self.heap)

    def sweep(self) -> int:
        """Free what has expired: pops the heap's due entries, never looks at the rest."""
        now = time.perf_counter()
        expired = 0
        while self.heap and self.heap[0][0] <= now:
            _, seq, request_id = heapq.heappop(self.heap)
            entry = self.retained.get(request_id)
            if entry is None or entry.seq != seq:
                continue  # released before it expired (or retained again later)
            if entry.kind == "lease":
                log.warning(
                    "Releasing expired KV blocks for request %s which were retrieved by 0 remote worker(s) "
                    "before lease expired.",
                    entry.request_id,
                )
            self.release(request_id, "expired")
            expired += 1
        return expired

    def next_deadline(self) -> float | None:
        return self.heap[0][0] if self.heap else None

    def serve_read(self, request_id: str, block_ids: list[int]) -> list[list[int]]:
        """What a peer's READ of `block_ids` gets: their current contents. The handle is then spent."""
        if not self.pool.valid(block_ids):
            raise ValueError(f"block ids out of range 1..{self.pool.num_blocks}")
        contents = self.pool.contents(block_ids)
        if not self.release(request_id, "read"):
            log.warning(
                "Potentially invalid KV blocks for unrecognized request %s were retrieved by a decode worker. "
                "They may have expired.",
                request_id,
            )
        return contents

    def handshake(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "perf_counter": time.perf_counter(), "tp_size": 1,
                "block_size": self.pool.block_size}


class SideChannel:
    """One peer's side channel: its own client, at most SIDE_CHANNEL_IN_FLIGHT requests at a time, and the queue
    of request ids to notify it of, sent in batches by one task."""

    def __init__(self, base: str, metrics: SimMetrics) -> None:
        self.base = base
        self.metrics = metrics
        # httpx applies `limits` only to its own transport: the semaphore bounds what is in flight, and so the
        # connections FastTransport opens; it keeps as many idle.
        self.client = httpx.AsyncClient(base_url=base, transport=FastTransport(max_idle=SIDE_CHANNEL_IN_FLIGHT))
        self.slots = asyncio.Semaphore(SIDE_CHANNEL_IN_FLIGHT)
        self.pending: list[str] = []
        self.flusher: asyncio.Task[None] | None = None

    async def call(self, method: str, path: str, timeout: float, body: Any = None) -> httpx.Response:
        async with self.slots:
            self.metrics.side_channel_started()
            try:
                r = await self.client.request(method, path, json=body, timeout=timeout)
            finally:
                self.metrics.side_channel_ended()
        r.raise_for_status()
        return r

    def notify(self, request_id: str) -> None:
        self.pending.append(request_id)
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        while self.pending:
            if len(self.pending) < NOTIFY_BATCH:
                await asyncio.sleep(NOTIFY_LINGER_S)  # before every batch: those that came meanwhile join it
            batch = self.pending[:NOTIFY_BATCH]
            del self.pending[:NOTIFY_BATCH]
            self.metrics.record_notify_batch(len(batch))
            try:
                await self.call("POST", "/notify", 5.0, {"request_ids": batch})
            except httpx.HTTPError as e:
                log.warning("Notify of %d request(s) to %s failed: %s", len(batch), self.base, e)
                self.metrics.lab(self.metrics.failed_notifs).inc(len(batch))

    async def aclose(self) -> None:
        if self.flusher is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self.flusher), 5.0)
            self.flusher.cancel()
            with contextlib.suppress(BaseException):
                await self.flusher
        await self.client.aclose()


class KVReader:
    """The initiating side of NIXL reads, over the peers' HTTP side channels (one SideChannel per peer)."""

    def __init__(self, metrics: SimMetrics, fail_reads: int = 0) -> None:
        self.metrics = metrics
        self.fail_reads = fail_reads
        self.offsets: dict[tuple[str, int], float] = {}
        self.channels: dict[tuple[str, int], SideChannel] = {}

    def channel(self, params: dict[str, Any]) -> SideChannel:
        key = (str(params["remote_host"]), int(params["remote_port"]))
        ch = self.channels.get(key)
        if ch is None:
            ch = self.channels[key] = SideChannel(f"http://{key[0]}:{key[1]}", self.metrics)
            self.metrics.lab(self.metrics.side_peers).set(len(self.channels))
        return ch

    async def clock_offset(self, params: dict[str, Any]) -> float:
        """Peer perf_counter minus ours, from a handshake (cached per peer, as NIXL agents are)."""
        key = (str(params["remote_host"]), int(params["remote_port"]))
        if key not in self.offsets:
            t0 = time.perf_counter()
            try:
                r = await self.channel(params).call("GET", "/handshake", 5.0)
                remote = float(r.json()["perf_counter"])
            except (httpx.HTTPError, ValueError, KeyError) as e:
                self.metrics.record_failure()
                raise ReadFailed(f"handshake with {key[0]}:{key[1]} failed: {e}") from e
            self.offsets[key] = remote - (t0 + time.perf_counter()) / 2
        return self.offsets[key]

    async def expired(self, params: dict[str, Any]) -> bool:
        expiry = params.get("remote_blocks_expiry_time")
        if expiry is None:
            return False
        offset = await self.clock_offset(params)
        if time.perf_counter() + EXPIRY_MARGIN_S >= float(expiry) - offset:
            log.warning(
                "Declining expired remote read for %s from engine %s.",
                params.get("remote_request_id"), params.get("remote_engine_id"),
            )
            self.metrics.record_expired()
            return True
        return False

    async def read(self, params: dict[str, Any], block_ids: list[int]) -> list[list[int]]:
        if self.fail_reads > 0:
            self.fail_reads -= 1
            self.metrics.record_failure()
            raise ReadFailed("injected failure (--fail-kv-reads)")
        body = {"request_id": params["remote_request_id"], "block_ids": block_ids}
        try:
            r = await self.channel(params).call("POST", "/read", 30.0, body)
            tokens = r.json()["tokens"]
        except (httpx.HTTPError, ValueError, KeyError) as e:
            self.metrics.record_failure()
            raise ReadFailed(f"read from {params.get('remote_engine_id')} failed: {e}") from e
        return [list(t) for t in tokens]

    def notify(self, params: dict[str, Any]) -> None:
        """Tell the peer its blocks are no longer needed (full local hit or below the threshold): queued, and sent
        with the others for that peer in one request."""
        self.channel(params).notify(str(params["remote_request_id"]))

    async def aclose(self) -> None:
        for ch in list(self.channels.values()):
            await ch.aclose()
