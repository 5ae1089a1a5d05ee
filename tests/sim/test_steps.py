"""The step model's pure functions: batch formation as vLLM's V1 scheduler, the token budget, step costs."""

from __future__ import annotations

import pytest

from pdctl.sim import steps
from pdctl.sim.steps import H200_GRAPHS, Seq, form_batch, step_ms


def decoding(rid: str, context: int, out_left: int = 10) -> Seq:
    return Seq(rid, prompt_left=0, computed=context, out_left=out_left)


def test_running_decodes_first_then_waiting_prefill_chunked_to_the_budget() -> None:
    running = [decoding("d1", 1000), decoding("d2", 2000)]
    waiting = [Seq("p1", prompt_left=10000, computed=0, out_left=1), Seq("p2", prompt_left=50, computed=0, out_left=1)]
    batch = form_batch(running, waiting, max_num_seqs=8, budget=8192)
    assert [(s.seq.rid, s.tokens, s.context) for s in batch.slots] == [
        ("d1", 1, 1000), ("d2", 1, 2000), ("p1", 8190, 0)]
    assert [s.rid for s in batch.admitted] == ["p1"]  # p2 waits: the budget is spent
    assert batch.num_tokens == 8192 and batch.decodes == 2


def test_a_partly_prefilled_request_continues_before_new_ones_are_admitted() -> None:
    running = [Seq("long", prompt_left=5000, computed=8192, out_left=1)]
    waiting = [Seq("next", prompt_left=4000, computed=0, out_left=1)]
    batch = form_batch(running, waiting, max_num_seqs=8, budget=8192)
    assert [(s.seq.rid, s.tokens, s.context) for s in batch.slots] == [("long", 5000, 8192), ("next", 3192, 0)]


def test_max_num_seqs_caps_admission() -> None:
    running = [decoding(f"d{i}", 100) for i in range(3)]
    waiting = [Seq("w1", 10, 0, 1), Seq("w2", 10, 0, 1)]
    batch = form_batch(running, waiting, max_num_seqs=4, budget=8192)
    assert [s.rid for s in batch.admitted] == ["w1"]


def test_a_request_waiting_for_remote_kv_is_skipped_and_later_ones_go_ahead() -> None:
    blocked = Seq("pulling", prompt_left=600, computed=24000, out_left=64, ready=False)
    other = Seq("other", prompt_left=600, computed=0, out_left=64)
    batch = form_batch([], [blocked, other], max_num_seqs=8, budget=8192)
    assert [s.seq.rid for s in batch.slots] == ["other"]
    blocked.ready = True
    assert [s.seq.rid for s in form_batch([], [blocked], 8, 8192).slots] == ["pulling"]


def test_tpot_grows_with_batch_size_and_context() -> None:
    one = step_ms(H200_GRAPHS, [(1, 24000)])
    four = step_ms(H200_GRAPHS, [(1, 24000)] * 4)
    assert 19.0 < one < 19.8  # measured 19.0-19.6 ms at one client (2.9k-24.9k context)
    assert four > one + 2.0
    assert step_ms(H200_GRAPHS, [(1, 2000)]) < one


def test_a_prefill_chunk_in_the_batch_stalls_every_decode_stream() -> None:
    decodes = [(1, 10000)] * 3
    assert step_ms(H200_GRAPHS, [*decodes, (8189, 0)]) > 5 * step_ms(H200_GRAPHS, decodes)


def test_advance_samples_the_first_token_when_the_prompt_is_done() -> None:
    seq = Seq("r", prompt_left=10000, computed=0, out_left=2)
    b1 = form_batch([], [seq], 8, 8192)
    assert steps.advance(b1) == [] and seq.produced == 0 and seq.prompt_left == 1808
    b2 = form_batch([seq], [], 8, 8192)
    assert steps.advance(b2) == [] and seq.produced == 1 and seq.computed == 10000
    assert steps.advance(form_batch([seq], [], 8, 8192)) == [seq] and seq.produced == 2


def test_alone_ttft_is_chunked_prefill_back_to_back() -> None:
    c = H200_GRAPHS
    chunks = [(8192, 0), (8192, 8192), (7616, 16384)]
    assert steps.alone_ttft_ms(c, 24000, 0) == pytest.approx(c.request_ms + sum(step_ms(c, [ch]) for ch in chunks))
    assert steps.alone_ttft_ms(c, 600, 24000) == pytest.approx(c.request_ms + step_ms(c, [(600, 24000)]))


def test_the_processes_own_time_counts_against_the_modelled_request_time() -> None:
    assert steps.unmodelled_ms(40.0, 15.0) == 25.0  # parsing and the side-channel read took 15 of the 40 modelled
    assert steps.unmodelled_ms(40.0, 55.0) == 0.0  # slower than the model: nothing left to wait, never negative
    assert steps.unmodelled_ms(40.0, -1.0) == 40.0


def test_the_graphs_fit_splits_the_two_h200_machines_at_24k() -> None:
    # Turns 2 and 3 of a 24k conversation: the single H200 (block 16) computed 528 new tokens in 175 ms median, the
    # P/D decode (block 256, local turns) 768 and 576 in 168 ms. One fit for both: below the one, above the other.
    c = H200_GRAPHS
    agg = (steps.alone_ttft_ms(c, 528, 24048) + steps.alone_ttft_ms(c, 528, 24624)) / 2
    local = (steps.alone_ttft_ms(c, 768, 23808) + steps.alone_ttft_ms(c, 576, 24576)) / 2
    assert -0.16 < agg / 175 - 1 < 0
    assert 0 < local / 168 - 1 < 0.16


def test_a_readback_waits_one_engine_step() -> None:
    assert steps.readback_wait_ms(H200_GRAPHS) == H200_GRAPHS.base_ms == 18.8
    assert steps.readback_wait_ms(steps.H200_EAGER) == 32.0
