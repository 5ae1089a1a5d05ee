"""One simulated engine: queueing, prefix cache, remote KV reads with the integrity oracle, and pacing.

A request runs in two parts: `Engine.start` does everything up to the first token (queue for a slot, local
prefix hit, the remote read, the compute) and returns a `Run`; `Run.tokens()` paces the rest, and
`Run.finish()` keeps the blocks for a peer and returns `kv_transfer_params` as vLLM's connector does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pdctl import prefix_check
from pdctl.sim import steps, timing
from pdctl.sim.blocks import BlockPool
from pdctl.sim.config import SimConfig
from pdctl.sim.kv import KVReader, KVStore, ReadFailed, block_group, is_handle
from pdctl.sim.metrics import SimMetrics
from pdctl.sim.scheduler import StepLoop, Ticket
from pdctl.sim.tokenizer import generate

log = logging.getLogger("pdctl.sim.engine")

# What marks a router's release (pdctl.router.kv.release.RELEASE_FIELD): with pdctl's patch to vLLM (the simulator's
# --prefix-check) the prefill frees its one block when it finishes instead of keeping it for a decode's pull.
RELEASE = "pdctl_release"


class EngineError(Exception):
    """A request the engine refuses or fails, with the HTTP status and OpenAI error type to report."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param


@dataclass
class GenRequest:
    request_id: str
    prompt: list[int]
    max_tokens: int
    kv_params: dict[str, Any] | None = None
    thinking: bool = False
    output: list[int] | None = None  # what the model writes, when the request decides it (a tool call, sample i)
    arrived: float | None = None  # perf_counter when this process began work on it (counted: see _prefill)


@dataclass
class Run:
    engine: Engine
    req: GenRequest
    output: list[int]
    block_ids: list[int]
    seq_len: int
    is_p: bool
    is_d: bool
    pacer: timing.Pacer
    ticket: Ticket | None = None  # the request's place in the step loop, with --step-model
    closed: bool = field(default=False)
    begun: float = field(default_factory=time.perf_counter)  # vLLM's request latencies start here
    cached: int = 0  # prompt tokens not computed here: its prefix-cache hit plus what it read from the peer

    async def tokens(self) -> AsyncIterator[int]:
        m = self.engine.metrics
        last = self.begun
        for i, token in enumerate(self.output):
            if i:
                if self.ticket is not None:
                    await self.ticket.next()
                else:
                    await self.pacer.wait_ms(timing.TPOT_MS)
            now = time.perf_counter()
            m.lab(m.inter_token if i else m.ttft).observe(now - last)
            last = now
            yield token

    def _leave_batch(self) -> None:
        if self.ticket is not None and self.engine.steps is not None:
            self.engine.steps.drop(self.ticket)

    def finish(self) -> dict[str, Any] | None:
        """The request completed: keep its blocks for the peer where the connector would, else free them."""
        if self.closed:
            return None
        self.closed = True
        self._leave_batch()
        eng = self.engine
        eng.metrics.lab(eng.metrics.generation_tokens).inc(len(self.output))
        eng.metrics.lab(eng.metrics.e2e).observe(time.perf_counter() - self.begun)
        params = None
        kv = self.req.kv_params or {}
        if self.is_p and kv.get(RELEASE) and eng.cfg.prefix_check:
            eng.pool.free_blocks(self.block_ids)  # pdctl's patch: a release's block is not kept for a pull
        elif self.is_p:
            eng.store.retain(self.req.request_id, self.block_ids, eng.cfg.kv.lease_duration, "lease")
            params = eng.handle(self.req.request_id, self.block_ids, self.seq_len, None, p_node=True)
            report = kv.get(prefix_check.REPORT)
            if report is not None:  # what the prefix check verified, as pdctl's patch adds it to vLLM's answer
                params[prefix_check.REPORT] = report
        elif self.is_d and eng.cfg.kv.bidirectional:
            deadline = eng.store.retain(self.req.request_id, self.block_ids, eng.cfg.kv.decoder_kv_blocks_ttl, "ttl")
            params = eng.handle(self.req.request_id, self.block_ids, self.seq_len, deadline, p_node=False)
        else:
            eng.pool.free_blocks(self.block_ids)
        eng.release_slot()
        return params

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self._leave_batch()
            self.engine.metrics.lab(self.engine.metrics.aborted).inc()
            self.engine.pool.free_blocks(self.block_ids)
            self.engine.release_slot()


class Engine:
    def __init__(self, cfg: SimConfig, metrics: SimMetrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.pool = BlockPool(cfg.num_gpu_blocks, cfg.block_size, cfg.prefix_caching)
        self.pool.on_free = self._kv_freed
        self.store = KVStore(self.pool, cfg.engine_id, metrics.record_freed)
        self.reader = KVReader(metrics, cfg.fail_kv_reads)
        self.slots = asyncio.Semaphore(cfg.max_num_seqs)
        self.compute_lock = asyncio.Lock()
        self.running = 0
        self.waiting = 0
        # Requests that hold a slot but wait for KV blocks, first come first served (see _allocate).
        self.kv_queue: deque[tuple[int, asyncio.Future[list[int]]]] = deque()
        self._admit_soon = False
        costs = steps.PROFILES.get(cfg.step_model or "")
        self.steps = (StepLoop(costs, cfg.max_num_seqs, cfg.speed, cfg.max_num_batched_tokens, metrics.record_step)
                      if costs is not None and timing.time_scale(cfg.speed) else None)
        if self.steps is not None:
            metrics.enable_steps()

    def gauges(self) -> None:
        m = self.metrics
        m.lab(m.running).set(self.running)
        m.lab(m.waiting).set(self.waiting)
        m.lab(m.kv_usage).set(self.pool.usage())
        m.record_kv(self.pool.num_blocks - self.pool.num_free, self.pool.num_blocks)
        m.record_retained(len(self.store.retained), self.store.retained_blocks, len(self.store.heap))

    def release_slot(self) -> None:
        self.running -= 1
        self.slots.release()
        self.gauges()

    def handle(self, rid: str, ids: list[int], num_tokens: int, expiry: float | None, p_node: bool) -> dict[str, Any]:
        return {
            "do_remote_prefill": p_node, "do_remote_decode": not p_node, "remote_block_ids": [list(ids)],
            "remote_engine_id": self.cfg.engine_id, "remote_request_id": rid,
            "remote_host": self.cfg.side_channel_host, "remote_port": self.cfg.side_channel_port,
            "tp_size": 1, "remote_num_tokens": num_tokens, "remote_blocks_expiry_time": expiry,
        }

    async def start(self, req: GenRequest) -> Run:
        pacer = timing.Pacer(self.cfg.speed)
        self.waiting += 1
        self.gauges()
        queued = time.perf_counter()
        try:
            await self.slots.acquire()
        finally:
            self.waiting -= 1
        if req.arrived is not None:  # waiting for a slot is queueing, not this process's own work
            req.arrived += time.perf_counter() - queued
        self.running += 1
        self.gauges()
        try:
            return await self._prefill(req, pacer)
        except BaseException:
            self.release_slot()
            raise

    async def _allocate(self, n: int) -> list[int]:
        """`n` free blocks, waiting for them as vLLM does when its KV is full rather than failing.

        vLLM's scheduler (vllm/v1/core/sched/scheduler.py, `schedule()`, the WAITING loop) leaves a new request in
        its waiting queue when `kv_cache_manager.allocate_slots(...)` returns None ("The request cannot be
        scheduled." then `break`: first come first served, nothing behind it is admitted either) and tries again
        next step; blocks retained for a peer are allocated, so they count against KV until freed. Here the
        request leaves the running count for the waiting one until blocks are freed (a finish, an abort, a peer's
        read or notify, or an expired retention, which the housekeeping sweep frees) and it is first in line."""
        if n > self.pool.num_blocks:
            raise EngineError(400, f"The request needs {n} KV blocks but the engine has {self.pool.num_blocks}.",
                              "BadRequestError", "input_tokens")
        if not self.kv_queue:
            if n > self.pool.num_free:
                self.store.sweep()  # due expiries only: a heap pop each
            if n <= self.pool.num_free:
                ids = self.pool.allocate(n)
                self.gauges()
                return ids
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self.kv_queue.append((n, fut))
        self.metrics.lab(self.metrics.kv_waits).inc()
        self.running -= 1
        self.waiting += 1
        self.gauges()
        try:
            return await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.pool.free_blocks(fut.result())  # admitted as it was cancelled
            else:
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self.kv_queue.remove((n, fut))  # at most max_num_seqs long: every waiter holds a slot
                self._kv_freed()  # whoever was behind it may fit now
            raise
        finally:
            self.waiting -= 1
            self.running += 1
            self.gauges()

    async def _blocks(self, prompt: list[int], total: int) -> tuple[list[int], list[int]]:
        """The request's prefix-cache hits and the new blocks it needs beside them (`total` in all).

        A request that must wait for blocks holds none while it waits, as in vLLM, whose scheduler takes a waiting
        request's cache hits only with the allocation that admits it (`allocate_slots`): two waiting requests that
        each held their hits could otherwise wait for each other's blocks for ever. It waits for `total`, then looks
        its hits up again and gives back the new blocks they make unnecessary."""
        pool = self.pool
        hit_ids = pool.lookup_prefix(prompt, len(prompt) - 1)
        need = total - len(hit_ids)
        if not self.kv_queue and need > pool.num_free:
            self.store.sweep()  # due expiries only: a heap pop each
        if not self.kv_queue and need <= pool.num_free:
            try:
                return hit_ids, await self._allocate(need)  # at once: nobody waits and the blocks are free
            except BaseException:
                pool.free_blocks(hit_ids)
                raise
        pool.free_blocks(hit_ids)
        fresh = await self._allocate(total)
        hit_ids = pool.lookup_prefix(prompt, len(prompt) - 1)
        need = total - len(hit_ids)
        pool.free_blocks(fresh[need:])
        return hit_ids, fresh[:need]

    def _kv_freed(self) -> None:
        """Blocks were freed: admit waiting requests once the freeing code has returned."""
        if self.kv_queue and not self._admit_soon:
            self._admit_soon = True
            asyncio.get_running_loop().call_soon(self._admit)

    def _admit(self) -> None:
        self._admit_soon = False
        while self.kv_queue:
            n, fut = self.kv_queue[0]
            if fut.done():
                self.kv_queue.popleft()
                continue
            if n > self.pool.num_free:
                return
            self.kv_queue.popleft()
            fut.set_result(self.pool.allocate(n))

    async def _prefill(self, req: GenRequest, pacer: timing.Pacer) -> Run:
        cfg, pool, T = self.cfg, self.pool, req.prompt
        n, m = len(T), req.max_tokens
        params = req.kv_params or {}
        is_p, is_d = bool(params.get("do_remote_decode")), bool(params.get("do_remote_prefill"))
        output = list(req.output[:m]) if req.output is not None else generate(T, m, req.thinking)
        seq = T + output[:-1]
        hit_ids, new_ids = await self._blocks(T, pool.blocks_for(len(seq)))
        ids = hit_ids + new_ids
        try:
            pulled, read_ms, held = await self._pull(req, params, is_p, is_d, seq, len(hit_ids), new_ids)
        except BaseException:
            pool.free_blocks(ids)
            raise
        hit = len(hit_ids) * pool.block_size
        pool.write(new_ids, seq, first_block=len(hit_ids), held=held)
        self.gauges()
        self.metrics.lab(self.metrics.prompt_tokens).inc(n)
        if pool.prefix_caching:
            self.metrics.lab(self.metrics.cache_queries).inc(n)
            self.metrics.lab(self.metrics.cache_hits).inc(hit)
        if self.steps is not None:
            # This process's own HTTP, JSON and side-channel time stands in for the real engine's per-request and
            # read time, which the model charges: it counts against them rather than on top (as in _spend).
            own = timing.modelled_ms(time.perf_counter() - req.arrived, cfg.speed) if req.arrived else 0.0
            await pacer.wait_ms(steps.unmodelled_ms(self.steps.costs.request_ms + read_ms, own)
                                + cfg.extra_latency_ms)
            ticket = self.steps.submit(req.request_id, n - hit - pulled, hit + pulled, len(output))
            try:
                await ticket.next()
            except BaseException:
                self.steps.drop(ticket)
                pool.free_blocks(ids)
                raise
            return Run(self, req, output, ids, len(seq), is_p, is_d, pacer, ticket, cached=hit + pulled)
        overhead = timing.DECODE_OVERHEAD_MS if is_d else timing.PREFILL_OVERHEAD_MS
        await pacer.wait_ms(overhead + read_ms + cfg.extra_latency_ms)
        compute_ms = timing.prefill_compute_ms(n - hit - pulled, hit + pulled)
        if pacer.scale:
            async with self.compute_lock:
                await pacer.wait_ms(compute_ms)
        if is_d:
            await pacer.wait_ms(timing.TPOT_MS)
        return Run(self, req, output, ids, len(seq), is_p, is_d, pacer, cached=hit + pulled)

    async def _pull(
        self, req: GenRequest, params: dict[str, Any], is_p: bool, is_d: bool, seq: list[int], hit_blocks: int,
        new_ids: list[int],
    ) -> tuple[int, float, list[int]]:
        """The remote read this request needs, if any: (tokens pulled, modelled ms, what the blocks hold)."""
        cfg, pool = self.cfg, self.pool
        d2p = is_p and cfg.kv.bidirectional and is_handle(params)
        if is_p and not cfg.kv.bidirectional and is_handle(params):
            log.warning("Request %s carries a decode handle but bidirectional_kv_xfer is off here: recomputing "
                        "(real vLLM may leave it waiting for remote KV)", req.request_id)
        if not (d2p or (is_d and is_handle(params))):
            return 0, 0.0, seq
        n = len(req.prompt)
        hit = hit_blocks * pool.block_size
        if d2p:  # as pdctl's patch to vLLM's scheduler: before a single remote token is counted
            if cfg.prefix_check:
                prefix_check.check(params, req.prompt, hit)  # what its own prefix cache holds
            limit = min(int(params.get("remote_num_tokens") or 0), n)  # vLLM: `or 0`; the router sends 0 + a spec
        else:  # the decode's pull: every prompt token the prefill computed
            limit = min(int(params.get("remote_num_tokens") or n), n)
        count = limit - hit
        if count <= 0 or count < cfg.kv.recompute_threshold:
            self.reader.notify(params)
            return 0, 0.0, seq
        k = pool.blocks_for(limit) - hit_blocks
        if cfg.kv_pull_delay_ms:
            await asyncio.sleep(cfg.kv_pull_delay_ms / 1000)
        try:
            if d2p and await self.reader.expired(params):
                raise ReadFailed("expired handle")
            group = block_group(params)
            if k > len(group):
                raise ReadFailed(f"handle holds {len(group)} blocks, {k} needed")
            # vLLM end-trims the remote group to the blocks it still needs (the #43094 hazard).
            remote_ids = group[-k:]
            content = await self.reader.read(params, remote_ids)
        except ReadFailed as e:
            log.warning("KV load failed for request %s: %s (kv_load_failure_policy=%s)",
                        req.request_id, e, cfg.kv.load_failure_policy)
            if cfg.kv.load_failure_policy == "fail":
                raise EngineError(500, f"KV transfer failed for request {req.request_id}: {e}",
                                  "InternalServerError") from e
            return 0, 0.0, seq
        descriptors = timing.num_descriptors(new_ids[:k], remote_ids)
        nbytes = timing.kv_bytes(k * pool.block_size)
        read_ms = timing.kv_read_ms(nbytes, descriptors)
        scale = timing.time_scale(cfg.speed)
        self.metrics.record_transfer(read_ms * scale / 1e3, timing.READ_POST_MS * scale / 1e3, nbytes, descriptors)
        if d2p:  # the readback's request then waits in WAITING_FOR_REMOTE_KVS for an engine step to see it done
            read_ms += timing.READBACK_WAIT_MS if self.steps is None else steps.readback_wait_ms(self.steps.costs)
        pulled = [t for block in content for t in block][:count]
        expected = req.prompt[hit:limit]
        if pulled != expected:
            where = next((i for i, (a, b) in enumerate(zip(pulled, expected, strict=False)) if a != b), len(pulled))
            self.metrics.lab(self.metrics.corrupt).inc()
            log.warning("pdctl-sim: corrupt KV reuse in request %s: %d tokens read from engine %s (request %s, "
                        "blocks %s) differ from the prompt from position %d on", req.request_id, count,
                        params.get("remote_engine_id"), params.get("remote_request_id"), remote_ids, hit + where)
        held = list(seq)
        held[hit:limit] = pulled + [-1] * (count - len(pulled))
        return count, read_ms, held
