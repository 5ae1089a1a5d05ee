"""One scheduler loop per engine: forms each step's batch (pdctl.sim.steps), sleeps its modelled time, and hands
each request the tokens that step sampled. Requests join when their prompt (less the cached and pulled part) is
ready to compute, so one that waits for remote KV is not in any batch until its read is done.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from pdctl.sim import steps, timing


@dataclass
class Ticket:
    """A request's place in the loop: wait for its next sampled token with `next()`."""

    seq: steps.Seq
    event: asyncio.Event = field(default_factory=asyncio.Event)
    taken: int = 0

    async def next(self) -> None:
        while self.taken >= self.seq.produced:
            self.event.clear()
            await self.event.wait()
        self.taken += 1


@dataclass
class StepStats:
    steps: int = 0
    modelled_ms: float = 0.0  # the sum of every step's modelled time, at speed 1
    batched_tokens: int = 0
    prefill_tokens: int = 0  # of batched_tokens: prompt chunks
    decode_tokens: int = 0  # of batched_tokens: one per decoding request per step

    def add(self, ms: float, prefill_tokens: int, decode_tokens: int) -> None:
        self.steps += 1
        self.modelled_ms += ms
        self.batched_tokens += prefill_tokens + decode_tokens
        self.prefill_tokens += prefill_tokens
        self.decode_tokens += decode_tokens


OnStep = Callable[[float, int, int], None]
"""Called after each step is formed: its modelled ms, prefill tokens, decode tokens (e.g. to export them)."""


class StepLoop:
    def __init__(self, costs: steps.StepCosts, max_num_seqs: int, speed: float, budget: int | None = None,
                 on_step: OnStep | None = None) -> None:
        self.costs = costs
        self.max_num_seqs = max_num_seqs
        self.budget = budget or costs.max_num_batched_tokens
        self.pacer = timing.Pacer(speed)
        self.running: list[Ticket] = []
        self.waiting: list[Ticket] = []
        self.stats = StepStats()
        self.on_step = on_step
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def submit(self, rid: str, new_tokens: int, context: int, outputs: int) -> Ticket:
        """Queue a request with `new_tokens` to compute after `context` in KV, sampling `outputs` tokens."""
        if new_tokens <= 0:  # all of it cached or pulled: vLLM still computes the last prompt token
            new_tokens, context = 1, max(context - 1, 0)
        ticket = Ticket(steps.Seq(rid, new_tokens, context, max(outputs, 1)))
        self.waiting.append(ticket)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return ticket

    def drop(self, ticket: Ticket) -> None:
        """The request finished or was aborted: it leaves the batch (and the queue)."""
        for queue in (self.running, self.waiting):
            with contextlib.suppress(ValueError):
                queue.remove(ticket)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    async def _run(self) -> None:
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            by_seq = {id(t.seq): t for t in (*self.running, *self.waiting)}
            batch = steps.form_batch([t.seq for t in self.running], [t.seq for t in self.waiting],
                                     self.max_num_seqs, self.budget)
            for seq in batch.admitted:
                ticket = by_seq[id(seq)]
                self.waiting.remove(ticket)
                self.running.append(ticket)
            ms = steps.step_ms(self.costs, batch.slots)
            decode_tokens = batch.decodes
            self.stats.add(ms, batch.num_tokens - decode_tokens, decode_tokens)
            if self.on_step is not None:
                self.on_step(ms, batch.num_tokens - decode_tokens, decode_tokens)
            await self.pacer.wait_ms(ms)
            finished = steps.advance(batch)
            for slot in batch.slots:
                by_seq[id(slot.seq)].event.set()
            for seq in finished:
                ticket = by_seq[id(seq)]
                with contextlib.suppress(ValueError):
                    self.running.remove(ticket)
            await asyncio.sleep(0)  # let the streams take their tokens even when the step was too short to sleep
