"""NIXL-connector behaviour: blocks kept for a peer (lease on P, TTL on D), the side channel that serves
reads of them (single use), and the initiator's remote read with its expiry check and fault injection."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from pdctl.sim.blocks import BlockPool
from pdctl.sim.metrics import SimMetrics

log = logging.getLogger("vllm.distributed.kv_transfer.kv_connector.v1.nixl")

# P declines a D->P read whose handle expires within this many seconds (pull_scheduler).
EXPIRY_MARGIN_S = 5.0
HANDLE_KEYS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")


class ReadFailed(Exception):
    """A remote KV read did not deliver blocks (the connector's failed-transfer path)."""


@dataclass
class Retained:
    request_id: str
    block_ids: list[int]
    deadline: float  # perf_counter, the clock vLLM advertises in remote_blocks_expiry_time
    kind: str  # "lease" (P, for D's pull) or "ttl" (D, for P's readback)


def is_handle(params: dict[str, Any]) -> bool:
    groups = params.get("remote_block_ids")
    return bool(groups) and all(params.get(k) is not None for k in HANDLE_KEYS)


def block_group(params: dict[str, Any]) -> list[int]:
    """Group 0 of `remote_block_ids` (very old versions sent one flat list)."""
    groups = params.get("remote_block_ids") or []
    first = groups[0] if groups and isinstance(groups[0], list) else groups
    return [int(b) for b in first]


class KVStore:
    """The blocks this engine keeps for peers, served over its side channel."""

    def __init__(self, pool: BlockPool, engine_id: str) -> None:
        self.pool = pool
        self.engine_id = engine_id
        self.retained: dict[str, Retained] = {}

    def retain(self, request_id: str, block_ids: list[int], seconds: float, kind: str) -> float:
        deadline = time.perf_counter() + seconds
        self.retained[request_id] = Retained(request_id, block_ids, deadline, kind)
        return deadline

    def release(self, request_id: str) -> bool:
        entry = self.retained.pop(request_id, None)
        if entry is None:
            return False
        self.pool.free_blocks(entry.block_ids)
        return True

    def sweep(self) -> int:
        now = time.perf_counter()
        expired = [e for e in self.retained.values() if e.deadline <= now]
        for entry in expired:
            if entry.kind == "lease":
                log.warning(
                    "Releasing expired KV blocks for request %s which were retrieved by 0 remote worker(s) "
                    "before lease expired.",
                    entry.request_id,
                )
            self.release(entry.request_id)
        return len(expired)

    def serve_read(self, request_id: str, block_ids: list[int]) -> list[list[int]]:
        """What a peer's READ of `block_ids` gets: their current contents. The handle is then spent."""
        if not self.pool.valid(block_ids):
            raise ValueError(f"block ids out of range 1..{self.pool.num_blocks}")
        contents = self.pool.contents(block_ids)
        if not self.release(request_id):
            log.warning(
                "Potentially invalid KV blocks for unrecognized request %s were retrieved by a decode worker. "
                "They may have expired.",
                request_id,
            )
        return contents

    def handshake(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "perf_counter": time.perf_counter(), "tp_size": 1,
                "block_size": self.pool.block_size}


class KVReader:
    """The initiating side of NIXL reads, over the peers' HTTP side channels."""

    def __init__(self, client: httpx.AsyncClient, metrics: SimMetrics, fail_reads: int = 0) -> None:
        self.client = client
        self.metrics = metrics
        self.fail_reads = fail_reads
        self.offsets: dict[tuple[str, int], float] = {}

    @staticmethod
    def _base(params: dict[str, Any]) -> str:
        return f"http://{params['remote_host']}:{int(params['remote_port'])}"

    async def clock_offset(self, params: dict[str, Any]) -> float:
        """Peer perf_counter minus ours, from a handshake (cached per peer, as NIXL agents are)."""
        key = (str(params["remote_host"]), int(params["remote_port"]))
        if key not in self.offsets:
            t0 = time.perf_counter()
            try:
                r = await self.client.get(f"{self._base(params)}/handshake", timeout=5.0)
                r.raise_for_status()
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
            r = await self.client.post(f"{self._base(params)}/read", json=body, timeout=30.0)
            r.raise_for_status()
            tokens = r.json()["tokens"]
        except (httpx.HTTPError, ValueError, KeyError) as e:
            self.metrics.record_failure()
            raise ReadFailed(f"read from {params.get('remote_engine_id')} failed: {e}") from e
        return [list(t) for t in tokens]

    async def notify(self, params: dict[str, Any]) -> None:
        """Tell the peer its blocks are no longer needed (full local hit or below the threshold)."""
        try:
            r = await self.client.post(
                f"{self._base(params)}/notify", json={"request_id": params["remote_request_id"]}, timeout=5.0
            )
            r.raise_for_status()
        except httpx.HTTPError:
            self.metrics.lab(self.metrics.failed_notifs).inc()
