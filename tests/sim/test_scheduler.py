"""The step loop with several clients at once: its steps and modelled time are the pure model's, step for step."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pdctl.sim import steps
from pdctl.sim.scheduler import StepLoop
from pdctl.sim.steps import H200_GRAPHS, Seq
from tests.sim.helpers import output_ids, two_hop
from tests.support.sim_procs import sim_pair

REQUESTS = [("a", 9000, 0, 4), ("b", 600, 20000, 6), ("c", 300, 0, 5), ("d", 12000, 0, 3)]


def replay(max_num_seqs: int, budget: int) -> tuple[int, float, dict[str, int]]:
    """The same requests through form_batch/step_ms/advance alone: step count, time, step of each first token."""
    waiting = [Seq(rid, new, ctx, out) for rid, new, ctx, out in REQUESTS]
    running: list[Seq] = []
    count, total, first = 0, 0.0, {}
    while running or waiting:
        batch = steps.form_batch(running, waiting, max_num_seqs, budget)
        for seq in batch.admitted:
            waiting.remove(seq)
            running.append(seq)
        count += 1
        total += steps.step_ms(H200_GRAPHS, batch.slots)
        for seq in steps.advance(batch):
            running.remove(seq)
        for seq in running + [s.seq for s in batch.slots]:
            if seq.produced and seq.rid not in first:
                first[seq.rid] = count
    return count, total, first


async def play(max_num_seqs: int, budget: int) -> tuple[int, float, dict[str, int], dict[str, int]]:
    loop = StepLoop(H200_GRAPHS, max_num_seqs, speed=500, budget=budget)
    first: dict[str, int] = {}
    tokens: dict[str, int] = {}

    async def client(rid: str, new: int, ctx: int, out: int) -> None:
        ticket = loop.submit(rid, new, ctx, out)
        for i in range(out):
            await ticket.next()
            if i == 0:
                first[rid] = loop.stats.steps
        tokens[rid] = ticket.taken
        loop.drop(ticket)

    await asyncio.gather(*(client(*r) for r in REQUESTS))
    return loop.stats.steps, loop.stats.modelled_ms, first, tokens


def test_four_clients_take_the_models_steps_and_time() -> None:
    steps_count, modelled, first, tokens = asyncio.run(play(8, 8192))
    want_count, want_ms, want_first = replay(8, 8192)
    assert steps_count == want_count
    assert abs(modelled - want_ms) < 1e-6
    assert first == want_first
    assert tokens == {"a": 4, "b": 6, "c": 5, "d": 3}


def test_max_num_seqs_one_serializes_the_requests() -> None:
    steps_count, modelled, first, _ = asyncio.run(play(1, 8192))
    want_count, want_ms, want_first = replay(1, 8192)
    assert (steps_count, first) == (want_count, want_first)
    assert abs(modelled - want_ms) < 1e-6
    # one at a time: a's 2 prefill chunks + 3 decodes, then b's 1 + 5, c's 1 + 4, d's 2 + 2
    assert steps_count == 5 + 6 + 5 + 4


def test_the_two_hop_flow_runs_through_the_step_loop(tmp_path: Path) -> None:
    step = ["--step-model", "h200-graphs"]
    with sim_pair(tmp_path, speed=1000, threshold=0, prefill_args=step, decode_args=step) as pair:
        turn1 = list(range(2000, 2300))
        chunks, handle = two_hop(pair, {"prompt": turn1}, max_tokens=8)
        out = output_ids(chunks)
        assert len(out) == 8 and handle["remote_num_tokens"] == len(turn1) + 7
        _, handle2 = two_hop(pair, {"prompt": turn1 + out + list(range(3000, 3100))}, d_handle=handle)
        assert pair.prefill.metric("vllm:nixl_xfer_time_seconds_count") == 1  # P read D's blocks back
        assert pair.prefill.metric("pdctl_sim_corrupt_reuse_total") == 0
        assert handle2["remote_request_id"] != handle["remote_request_id"]
