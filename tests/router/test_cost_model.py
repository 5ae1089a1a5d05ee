"""The per-turn cost model (pdctl/router/turn/cost.py) and its rates (rates.py), as pure functions: which source a
warm turn's KV comes from in each case, and the rates it predicts with."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from pdctl import prefix_check
from pdctl.defaults import LOCAL_STALL_RATIO, SAFE_LOCAL_TOKENS
from pdctl.errors import UsageError
from pdctl.router.config import RouterConfig
from pdctl.router.turn import choices
from pdctl.router.turn.cost import (
    ITL_HEADROOM,
    NEVER_READ,
    PROBE_MARGIN,
    Choice,
    Speeds,
    Turn,
    break_even,
    choose,
    chunk_of,
    through_prefill,
    unmeasured,
)
from pdctl.router.turn.rates import MIN_SAMPLES, STALE_S, Line, Rates
from pdctl.router.turn.verify import Verdict, at_prefill, hit_params
from pdctl.router.upstream.load import Work
from pdctl.router.upstream.pools import Upstream
from pdctl.router.wire import D_TO_P, DECODE_CACHE, DECODE_READ, P_TO_D, READ_NOT_WORTH, RECOMPUTED, KvChoice

FLOOR = 256  # router.min_read_tokens
SLO = 200.0  # router.itl_slo_ms
CAP = 4096  # router.local_prefill_tokens


def per_s(tokens_per_s: float, fixed_ms: float = 0.0) -> Line:
    return Line(fixed_ms, 1000 / tokens_per_s)


# An H200-like pair: the prefill computes 8k tokens/s, the decode as fast; reads at 200k tokens/s, pulls at 400k;
# a decode step of 20 ms.
FAST = Speeds(prefill=per_s(8000), local=per_s(8000), read=per_s(200_000), pull=per_s(400_000), step_ms=20.0)


def turn(held: int, missing: int, streams: int = 0, decode_queued: int = 0, prefill_queued: int = 0,
         chunk: int = 0) -> Turn:
    return Turn(held, missing, streams, decode_queued, prefill_queued, chunk)


def test_an_idle_decode_that_holds_all_but_a_few_tokens_runs_the_turn_alone() -> None:
    c = choose(turn(8000, 200), FAST, FLOOR, SLO, CAP)
    assert (c.source, c.basis, c.refused) == (DECODE_CACHE, "model", None)
    assert c.ttft_ms is not None and c.ttft_ms < 100  # 200 tokens at 8k/s and a step
    assert c.others_ms == 0  # nobody else on the decode


def test_a_busy_decode_refuses_a_turn_whose_step_would_break_the_itl_budget() -> None:
    # 2000 new tokens at 8k tokens/s: a 250 ms stall in every stream's step, over the 200 ms budget.
    c = choose(turn(8000, 2000, streams=12), FAST, FLOOR, SLO, CAP)
    assert (c.source, c.refused) == (DECODE_READ, "itl")
    # The same turn on an idle decode stalls nobody: it runs there.
    assert choose(turn(8000, 2000, streams=0), FAST, FLOOR, SLO, CAP).source == DECODE_CACHE
    # Within a larger budget and ratio it runs there: the others' stall is bounded per step, not priced against
    # the turn's own time (it is reported: 12 streams x 250 ms).
    relaxed = choose(turn(8000, 2000, streams=12), FAST, FLOOR, 1000.0, CAP, stall_ratio=100)
    assert (relaxed.source, relaxed.basis, relaxed.others_ms) == (DECODE_CACHE, "model", 12 * 250.0)
    free = choose(turn(8000, 2000, streams=12), FAST, FLOOR, 1000.0, CAP, stall_ratio=0)  # ratio 0: the budget alone
    assert (free.source, free.basis, free.others_ms) == (DECODE_CACHE, "model", 12 * 250.0)


def test_an_idle_decode_takes_a_long_local_turn_that_a_busy_one_refuses_for_its_stall() -> None:
    # 1000 tokens at 8k/s: a 125 ms stall. Nobody else on the decode: nobody pays it, the turn runs there.
    idle = choose(turn(8000, 1000), FAST, FLOOR, SLO, CAP)
    assert (idle.source, idle.refused, idle.others_ms) == (DECODE_CACHE, None, 0.0)
    # One stream beside it: its 20 ms step would become 145 ms, within the ITL budget (150 ms planned) but 7x the
    # gap it sees anyway, which a turn through the prefill would not lengthen at all.
    busy = choose(turn(8000, 1000, streams=1), FAST, FLOOR, SLO, CAP)
    assert (busy.source, busy.basis, busy.refused) == (DECODE_READ, "model", "stall")
    assert busy.ttft_ms is not None and busy.others_ms == 0.0  # priced as the prefill path it takes
    # The bound is the ratio: 32 tokens stall 4 ms, a 24 ms step, 1.2x; one token more is over it.
    assert LOCAL_STALL_RATIO == 1.2
    assert choose(turn(8000, 32, streams=3), FAST, FLOOR, SLO, CAP).source == DECODE_CACHE
    assert choose(turn(8000, 33, streams=3), FAST, FLOOR, SLO, CAP).refused == "stall"
    # A slower decode step is the larger gap its streams see anyway: the same stall is a smaller share of it.
    assert choose(turn(8000, 100, streams=3), replace(FAST, step_ms=80.0), FLOOR, SLO, CAP).source == DECODE_CACHE
    assert choose(turn(8000, 100, streams=3), FAST, FLOOR, SLO, CAP).refused == "stall"
    # Prompts queued on the decode are stall too.
    assert choose(turn(8000, 16, streams=3, decode_queued=40), FAST, FLOOR, SLO, CAP).refused == "stall"
    # 0: the ITL budget alone (the model before this bound).
    queued = turn(8000, 1000, streams=1, prefill_queued=2000)  # the prefill busy: local is the cheaper way
    assert choose(queued, FAST, FLOOR, SLO, CAP).refused == "stall"
    assert choose(queued, FAST, FLOOR, SLO, CAP, stall_ratio=0).source == DECODE_CACHE


def test_a_decode_that_chunks_its_prompts_takes_a_long_turn_whose_every_step_stays_within_the_bounds() -> None:
    # 2000 tokens beside 4 streams: in one step (8k tokens/s) a 250 ms stall, over the ITL budget. A decode whose
    # steps compute at most 404 tokens (max_num_batched_tokens) computes them 400 at a time beside its 4 streams: 5
    # steps. Its local line is then per token slot of those steps (0.125 ms: a step with a chunk takes 50 ms, 30
    # more than its streams' 20). Their largest gap is 60 ms anyway (a prefill shares their GPU): 50 ms is within
    # 1.2x that. TTFT: 5 steps of 50 ms = 250, under 585 ms through a prefill with 2000 tokens queued.
    assert chunk_of(404, 4) == 400 and chunk_of(0, 4) == 0 and chunk_of(10, 20) == 1
    long = turn(8000, 2000, streams=4, prefill_queued=2000, chunk=chunk_of(404, 4))
    assert (long.per_step, long.steps) == (400, 5)
    gapped = replace(FAST, gap_ms=60.0)
    c = choose(long, gapped, FLOOR, SLO, CAP)
    assert (c.source, c.basis, c.refused, c.ttft_ms, c.others_ms) == (DECODE_CACHE, "model", None, 250.0, 4 * 5 * 30.0)
    # Its gap not measured, the step is the bound: 50 ms is over 1.2 x 20.
    assert choose(long, FAST, FLOOR, SLO, CAP).refused == "stall"
    # A chunk step no longer than the streams' own (an eager GPU decode, whose step is its launches: on one H100 a
    # 500-token chunk) stalls nothing: within the bound even against the step.
    cheap = replace(FAST, local=per_s(25_000, 50.0))  # 16 ms a 400-token step, 50 ms of fixed cost
    c = choose(long, cheap, FLOOR, SLO, CAP)
    assert (c.source, c.refused, c.ttft_ms, c.others_ms) == (DECODE_CACHE, None, 50 + 5 * 16.0, 0.0)
    # In one step (no budget known) the same turn breaks the ITL budget, whatever the gap.
    assert choose(replace(long, chunk=0), gapped, FLOOR, SLO, CAP).refused == "itl"
    # Queued local prompts share the chunks: 400 tokens ahead make it 6 steps.
    queued = replace(long, decode_queued=400)
    assert (queued.per_step, queued.steps) == (400, 6)
    assert choose(queued, gapped, FLOOR, SLO, CAP).ttft_ms == 6 * 50.0
    # A probe of the decode's unmeasured local costs is priced a chunk a step too (PROBE_MARGIN x the prefill's),
    # and on a decode whose budget is known, against the ITL budget alone: its gap not measured (a 70 ms step is
    # over 1.2 x 20) it still probes; a chunk over the ITL budget does not; in one step neither.
    unknown = replace(FAST, local=None)
    probe = choose(long, unknown, FLOOR, SLO, CAP)
    assert (probe.source, probe.basis, probe.ttft_ms) == (DECODE_CACHE, "probe", 2000 * PROBE_MARGIN / 8 + 5 * 20)
    assert choose(replace(long, chunk=600), unknown, FLOOR, SLO, CAP).refused == "unmeasured"  # 20 + 150 ms
    assert choose(replace(long, chunk=0), unknown, FLOOR, SLO, CAP).refused == "unmeasured"


def test_a_streams_largest_gap_is_kept_beside_its_step_by_streams_in_flight() -> None:
    rates = Rates(lambda: 1.0)
    for _ in range(MIN_SAMPLES):
        rates.stepped("http://d", 0, 8, 20.0, 45.0)
        rates.stepped("http://d", 0, 1, 10.0)  # no gap known (a stream a local prompt stalled throughout)
    e = rates.engine("http://d", 0)
    assert (e.step_ms(9, 1.0), e.gap_ms(9, 1.0)) == (20.0, 45.0)
    assert (e.step_ms(1, 1.0), e.gap_ms(1, 1.0)) == (10.0, 45.0)  # the nearest bucket measured
    assert rates.snapshot()["engines"] == {"http://d": {"generation": 0, "tokens_per_s": {}, "fixed_ms": {},
                                                        "step_ms": {"1": 10.0, "8-15": 20.0},
                                                        "gap_ms": {"8-15": 45.0}}}
    assert ("gap_ms", "http://d", "8-15", 45.0) in rates.gauges()
    d, p = Upstream("http://d", "decode"), Upstream("http://p", "prefill")
    assert choices.speeds(rates, d, p, 4000, 8).gap_ms == 45.0


def test_a_prompt_counted_on_a_decode_marks_when_it_finished_so_the_gaps_it_stalled_are_left_out() -> None:
    # The relay (turn/decode.py) keeps a stream's largest gap only where no local prompt was being computed on its
    # decode: else the bound a local turn's stall is held to would grow with the stalls it allows.
    u = Upstream("http://d", "decode")
    work = Work(u, 600)
    assert (u.work, u.work_done_at) == (600, 0.0)
    before = time.perf_counter()
    work.done()
    work.done()  # once
    assert u.work == 0 and u.work_done_at >= before
    at = u.work_done_at
    Work(u, 0).done()  # nothing computed: nothing finished
    assert u.work_done_at == at


def test_prompts_already_queued_on_the_decode_count_against_the_itl_budget() -> None:
    # 100 new tokens stall 12.5 ms; 1400 tokens of other local turns not yet at their first token, 175 ms more.
    c = choose(turn(8000, 100, streams=2, decode_queued=1400), FAST, FLOOR, SLO, CAP)
    assert (c.source, c.refused) == (DECODE_READ, "itl")
    assert choose(turn(8000, 100, streams=2, decode_queued=400), FAST, FLOOR, SLO, CAP).refused != "itl"


def test_a_small_stall_on_a_lightly_loaded_decode_stays_local() -> None:
    c = choose(turn(8000, 24, streams=2), FAST, FLOOR, SLO, CAP)  # 3 ms on a 20 ms step
    assert c.source == DECODE_CACHE
    assert c.others_ms == 2 * 24 / 8000 * 1000


def test_local_prefill_tokens_caps_what_runs_on_the_decode() -> None:
    c = choose(turn(8000, 5000), FAST, FLOOR, SLO, CAP)
    assert (c.source, c.refused) == (DECODE_READ, "cap")
    assert choose(turn(8000, 100), FAST, FLOOR, SLO, 0).refused == "cap"  # 0: conditional disaggregation off


def test_a_decode_busy_with_queued_prompts_sends_the_turn_to_an_idle_prefill() -> None:
    c = choose(turn(8000, 1000, streams=1, decode_queued=20_000), FAST, FLOOR, SLO, CAP)
    assert (c.source, c.refused) == (DECODE_READ, "itl")  # 2.5 s of prompts to compute there first
    relaxed = choose(turn(8000, 1000, streams=1, decode_queued=20_000), FAST, FLOOR, 10_000.0, CAP, stall_ratio=0)
    assert (relaxed.source, relaxed.refused) == (DECODE_READ, "slower")  # within the budget, still slower


def test_a_cache_holding_part_of_the_history_reads_that_part() -> None:
    # A partial: the decode holds 3000 of 9000 tokens; the rest is the prefill's to compute.
    c = through_prefill(turn(3000, 6000), FAST, FLOOR)
    assert c.source == DECODE_READ
    assert c.ttft_ms is not None
    whole = through_prefill(turn(0, 9000), FAST, FLOOR)  # holding none: recomputed, and slower
    assert whole.source == RECOMPUTED and whole.ttft_ms is not None and whole.ttft_ms > c.ttft_ms


def test_a_read_slower_than_recompute_is_not_made() -> None:
    slow_link = Speeds(prefill=per_s(8000), local=None, read=per_s(4000, 1.0), pull=per_s(400_000), step_ms=20.0)
    assert break_even(per_s(8000), per_s(4000, 1.0), FLOOR) == (NEVER_READ, "model")
    c = through_prefill(turn(12_000, 100), slow_link, FLOOR)
    assert (c.source, c.min_read) == (RECOMPUTED, NEVER_READ)


def test_reads_slower_at_the_one_size_seen_are_tried_again_at_twice_that_size() -> None:
    # Every read so far moved ~300 tokens and took longer than computing them: the fixed part is not known.
    seen = Line(0.0, 0.5, around=300.0)
    assert break_even(per_s(8000), seen, FLOOR) == (601, "model")
    link = Speeds(prefill=per_s(8000), local=None, read=seen, pull=per_s(400_000), step_ms=None)
    assert through_prefill(turn(300, 50), link, FLOOR).source == RECOMPUTED
    assert through_prefill(turn(4000, 50), link, FLOOR).source == DECODE_READ


def test_a_short_history_on_a_link_barely_faster_than_compute_is_recomputed() -> None:
    # The read saves 1/8000 - 1/10000 s a token against a fixed cost of 256 tokens of compute: worth it from 1281.
    min_read, basis = break_even(per_s(8000), per_s(10_000), FLOOR)
    assert (min_read, basis) == (1281, "model")
    link = Speeds(prefill=per_s(8000), local=None, read=per_s(10_000), pull=per_s(400_000), step_ms=None)
    assert through_prefill(turn(1000, 50), link, FLOOR).source == RECOMPUTED
    assert through_prefill(turn(2000, 50), link, FLOOR).source == DECODE_READ
    # A fast link reads from the floor up; the floor still holds for shorter histories.
    assert break_even(per_s(8000), per_s(10_000_000), FLOOR)[0] == FLOOR + 1
    assert break_even(per_s(8000), per_s(10_000), 0) == (0, "default")  # min_read_tokens 0: always read


def test_a_read_with_a_measured_fixed_cost_is_made_for_long_histories_only() -> None:
    # A slow handshake (300 ms) on a fast link: worth it from 300 / (0.125 - 0.005) = 2500 tokens on.
    link = Speeds(prefill=per_s(8000), local=None, read=per_s(200_000, 300.0), pull=per_s(400_000), step_ms=None)
    assert break_even(link.prefill, link.read, FLOOR) == (2501, "model")
    assert through_prefill(turn(1000, 50), link, FLOOR).source == RECOMPUTED
    long = through_prefill(turn(16_000, 50), link, FLOOR)
    assert long.source == DECODE_READ
    assert long.ttft_ms is not None and long.ttft_ms < 16_050 / 8  # reading beats computing 16k tokens


def test_rates_not_yet_measured_fall_back_to_the_rule_before_the_model() -> None:
    unknown = Speeds(None, None, None, None, None)
    c = choose(turn(8000, 200), unknown, FLOOR, SLO, CAP)
    assert (c.basis, c.min_read, c.ttft_ms, c.refused) == ("default", FLOOR, None, None)  # local_policy load's
    no_local = Speeds(per_s(8000), None, per_s(200_000), per_s(400_000), 20.0)
    assert choose(turn(8000, 200), no_local, FLOOR, SLO, CAP).basis == "default"
    no_read = Speeds(per_s(8000), per_s(8000), None, per_s(400_000), 20.0)
    assert break_even(per_s(8000), None, FLOOR) == (FLOOR, "default")
    assert choose(turn(8000, 200), no_read, FLOOR, SLO, CAP).basis == "model"  # placement needs no read rate


def test_until_the_decode_is_measured_a_local_prefill_beside_other_streams_goes_through_the_prefill() -> None:
    # Nothing says what the tokens cost in the decode's batch: its streams' ITL is not risked on a guess.
    for speeds in (Speeds(None, None, None, None, None),  # nothing measured yet
                   Speeds(per_s(8000), None, per_s(200_000), per_s(400_000), 20.0),  # the decode's compute not
                   Speeds(per_s(8000), per_s(8000), per_s(200_000), per_s(400_000), None)):  # its step not
        c = choose(turn(8000, 2000, streams=4), speeds, FLOOR, SLO, CAP)
        assert (c.source, c.basis, c.refused) == (DECODE_READ, "default", "unmeasured")
        short = choose(turn(8000, 100, streams=1), speeds, FLOOR, SLO, CAP)
        assert (short.basis, short.refused) == ("default", "unmeasured")  # short too: a stall of unknown length
        idle = choose(turn(8000, 2000), speeds, FLOOR, SLO, CAP)
        assert (idle.basis, idle.refused) == ("default", None)  # no other stream to stall: as before too
    # Measured, the same turn on an idle decode is the model's to price: it runs there.
    assert choose(turn(8000, 2000), FAST, FLOOR, SLO, CAP).source == DECODE_CACHE


def test_local_stall_ratio_zero_bounds_a_local_turn_by_the_itl_budget_alone() -> None:
    # 600 tokens beside 2 streams: a 75 ms stall on a 20 ms step, 4.75x it; 95 ms within the 150 ms planned.
    t = turn(8000, 600, streams=2, prefill_queued=4000)  # the prefill busy: local is the cheaper way
    assert choose(t, FAST, FLOOR, SLO, CAP, stall_ratio=1.2).refused == "stall"
    free = choose(t, FAST, FLOOR, SLO, CAP, stall_ratio=0)
    assert (free.source, free.basis, free.refused) == (DECODE_CACHE, "model", None)
    # The ITL budget still holds without the ratio: 1400 tokens, a 195 ms step.
    assert choose(replace(t, missing=1400), FAST, FLOOR, SLO, CAP, stall_ratio=0).refused == "itl"


def test_local_stall_ratio_zero_probes_a_busy_decode_whose_local_costs_are_not_measured() -> None:
    # So that a decode that always has other streams gets its local rates measured: one probe at a time, its stall
    # priced at PROBE_MARGIN x the prefill's compute (8k tokens/s: 0.25 ms a token) within the ITL budget.
    unknown = Speeds(per_s(8000), None, per_s(200_000), per_s(400_000), 20.0)
    assert PROBE_MARGIN == 2.0 and ITL_HEADROOM * SLO == 150.0
    probe = choose(turn(8000, 520, streams=4), unknown, FLOOR, SLO, CAP, stall_ratio=0)  # 20 + 130 ms
    assert (probe.source, probe.basis, probe.refused, probe.ttft_ms, probe.others_ms) == (
        DECODE_CACHE, "probe", None, 150.0, 4 * 130.0)
    long = choose(turn(8000, 521, streams=4), unknown, FLOOR, SLO, CAP, stall_ratio=0)  # over the budget
    assert (long.source, long.basis, long.refused) == (DECODE_READ, "default", "unmeasured")
    queued = choose(turn(8000, 100, streams=4, decode_queued=100), unknown, FLOOR, SLO, CAP, stall_ratio=0)
    assert queued.refused == "unmeasured"  # another local prompt already in the batch: not two guesses at once
    # With the default ratio a probe's priced stall must also keep the step within 1.2x it: 100 tokens (+25 ms
    # on a 20 ms step) do not, 8 tokens (+2 ms) do; and nothing is guessed before the prefill's rate is measured.
    assert choose(turn(8000, 100, streams=4), unknown, FLOOR, SLO, CAP).refused == "unmeasured"  # ratio 1.2
    few = choose(turn(8000, 8, streams=4), unknown, FLOOR, SLO, CAP)
    assert (few.source, few.basis, few.refused, few.ttft_ms) == (DECODE_CACHE, "probe", None, 22.0)
    assert choose(turn(8000, 8, streams=4), Speeds(None, None, None, None, None), FLOOR, SLO, CAP).refused == (
        "unmeasured")
    # Nothing measured yet but a turn lacking at most SAFE_LOCAL_TOKENS: still a probe, the only guess left.
    assert SAFE_LOCAL_TOKENS == 512
    blind = Speeds(None, None, None, None, None)
    short = choose(turn(8000, 512, streams=4), blind, FLOOR, SLO, CAP, stall_ratio=0)
    assert (short.source, short.basis, short.refused) == (DECODE_CACHE, "probe", None)
    assert choose(turn(8000, 513, streams=4), blind, FLOOR, SLO, CAP, stall_ratio=0).refused == "unmeasured"
    via = through_prefill(turn(8000, 512), blind, FLOOR)
    assert unmeasured(turn(8000, 512, streams=4), via, 0).basis == "probe"
    assert unmeasured(turn(8000, 512), via, 0).basis == "default"  # no other stream: the load rule's, as before


def test_the_router_refuses_a_negative_stall_ratio() -> None:
    with pytest.raises(UsageError, match=r"--local-stall-ratio must be >= 0 \(0: no stall bound\), got -1"):
        RouterConfig(prefill=("http://p",), decode=("http://d",), local_stall_ratio=-1)
    assert RouterConfig(prefill=("http://p",), decode=("http://d",)).local_stall_ratio == LOCAL_STALL_RATIO


def test_a_step_predicted_near_the_itl_budget_keeps_headroom_for_the_largest_gap() -> None:
    # The SLO bounds each stream's largest gap; the prediction is a mean. 20 ms step + 1200 tokens at 8k/s = 170 ms:
    # within 200 ms, but over the 150 ms the model plans to, so it goes through the prefill.
    assert ITL_HEADROOM * SLO < 20 + 1200 / 8 < SLO
    c = choose(turn(8000, 1200, streams=3), FAST, FLOOR, SLO, CAP)
    assert (c.source, c.refused) == (DECODE_READ, "itl")
    assert choose(turn(8000, 1000, streams=3), FAST, FLOOR, SLO, CAP).refused != "itl"  # 145 ms: within


def test_the_way_through_the_prefill_is_compared_as_its_turns_measured_against_their_predictions() -> None:
    # 1000 tokens beside one stream: a 145 ms step, within the ITL budget; 145 ms of TTFT against 457.5 ms
    # predicted through a prefill with 2000 tokens queued. Those turns measured at a quarter of their predictions
    # (the prefill's own cache held the history the model priced as a read): the prefill is the cheaper way.
    t = turn(8000, 1000, streams=1, prefill_queued=2000)
    local = choose(t, FAST, FLOOR, SLO, CAP, stall_ratio=100)
    assert (local.source, local.ttft_ms, local.others_ms) == (DECODE_CACHE, 145.0, 125.0)
    c = choose(t, replace(FAST, via_bias=1 / 4), FLOOR, SLO, CAP, stall_ratio=100)
    assert (c.source, c.refused, c.ttft_ms) == (DECODE_READ, "slower", 457.5)  # it says the model's prediction
    rates = Rates(lambda: 1.0)
    assert rates.bias("prefill") == 1.0  # not measured: no correction
    for _ in range(MIN_SAMPLES):
        rates.predicted("prefill", 600.0, 200.0)
    assert round(rates.bias("prefill"), 3) == round(1 / 3, 3) and rates.bias("local") == 1.0
    rates.predicted("local", 10.0, 1e6)  # one stalled turn moves the bias at most to BIAS_RANGE's bound
    rates.predicted("local", 10.0, 1e6)
    assert rates.bias("local") == 4.0
    assert (rates.snapshot()["bias"]) == {"prefill": round(1 / 3, 3), "local": 4.0}


def test_local_turns_slower_than_predicted_tighten_the_itl_check_and_faster_ones_never_relax_it() -> None:
    t = turn(8000, 800, streams=3)  # 20 + 100 ms: within 150 ms
    assert choose(t, FAST, FLOOR, SLO, CAP).refused != "itl"
    assert choose(t, replace(FAST, local_bias=1.5), FLOOR, SLO, CAP).refused == "itl"  # 20 + 150 ms
    big = turn(8000, 1200, streams=3)  # 20 + 150 ms: over, however fast local turns came in
    assert choose(big, replace(FAST, local_bias=0.5), FLOOR, SLO, CAP).refused == "itl"


def test_a_rate_counts_after_its_samples_and_until_it_goes_stale() -> None:
    now = [100.0]
    rates = Rates(lambda: now[0])
    for _ in range(MIN_SAMPLES - 1):
        rates.computed("http://p", 0, 4000, 4000, 0.5)
    assert rates.engine("http://p", 0).compute_line(4000, now[0]) is None
    rates.computed("http://p", 0, 4000, 4000, 0.5)
    one_size = Line(0.0, 0.125, around=4000.0)  # one size seen: no fixed part
    assert rates.engine("http://p", 0).compute_line(4000, now[0]) == one_size
    assert rates.engine("http://p", 0).compute_line(60_000, now[0]) == one_size  # the nearest measured context
    rates.computed("http://p", 0, 4000, 8, 0.001)  # too few tokens to say anything about a rate
    assert rates.engine("http://p", 0).compute_line(4000, now[0]) == one_size
    now[0] += STALE_S + 1
    assert rates.engine("http://p", 0).compute_line(4000, now[0]) is None


def test_sizes_that_spread_give_the_fixed_part_and_the_speed() -> None:
    rates = Rates(lambda: 1.0)
    rates.computed("http://p", 0, 1500, 1000, 0.150)  # 25 ms of overhead + 0.125 ms a token
    rates.computed("http://p", 0, 1500, 4000, 0.525)
    line = rates.engine("http://p", 0).compute_line(1500, 1.0)
    assert line is not None
    assert (round(line.fixed_ms, 6), round(line.per_token_ms, 6)) == (25.0, 0.125)
    assert round(line.tokens_per_s) == 8000


def test_a_restarted_decode_starts_from_no_rates() -> None:
    rates = Rates(lambda: 1.0)
    d, p = Upstream("http://d", "decode"), Upstream("http://p", "prefill")
    for _ in range(MIN_SAMPLES):
        rates.computed(d.url, d.generation, 4000, 4000, 0.5)
        rates.computed(p.url, p.generation, 4000, 4000, 0.5)
        rates.moved(D_TO_P, d.url, p.url, 4000, 0.02)
        rates.moved(P_TO_D, p.url, d.url, 4000, 0.01)
        rates.stepped(d.url, d.generation, 4, 20.0)
    measured = choices.speeds(rates, d, p, 4000, 3)
    assert None not in (measured.prefill, measured.local, measured.read, measured.pull, measured.step_ms)
    d.generation += 1  # the pool saw it die and come back
    after = choices.speeds(rates, d, p, 4000, 3)
    assert (after.local, after.read, after.pull, after.step_ms) == (None, None, None, None)
    assert after.prefill == measured.prefill  # the prefill's own rate is its own
    assert choices.local(rates, d, p, 8000, 200, FLOOR, SLO, CAP).basis == "default"


def test_the_step_time_is_read_at_the_streams_in_flight() -> None:
    rates = Rates(lambda: 1.0)
    for _ in range(MIN_SAMPLES):
        rates.stepped("http://d", 0, 1, 10.0)
        rates.stepped("http://d", 0, 16, 40.0)
    e = rates.engine("http://d", 0)
    assert e.step_ms(1, 1.0) == 10.0
    assert e.step_ms(5, 1.0) == 10.0  # nothing measured at 4-7: the nearest fewer streams
    assert e.step_ms(20, 1.0) == 40.0
    assert e.step_ms(100, 1.0) == 40.0


def test_the_break_even_travels_to_the_prefill_with_the_handle() -> None:
    spec = prefix_check.spec(list(range(512)), 512, 16, True, FLOOR)
    pending = at_prefill({"remote_num_tokens": 512, "remote_block_ids": list(range(32))}, spec)
    slow = Speeds(per_s(8000), None, per_s(4000, 1.0), per_s(400_000), None)
    never = through_prefill(turn(512, 50), slow, FLOOR)
    sent = choices.with_min_read(pending, never, FLOOR)
    assert sent.params[prefix_check.FIELD]["min_read"] == NEVER_READ
    assert pending.params[prefix_check.FIELD]["min_read"] == FLOOR  # the handle's own spec is untouched
    # The prefill then reads nothing: a recompute (nothing of it in its own cache).
    params = dict(sent.params)
    report = prefix_check.check(params, list(range(600)), cached=0)
    assert report is not None and (report["reason"], params["remote_num_tokens"]) == (READ_NOT_WORTH, 0)
    # Verified at the router, the same choice is a recompute decided here.
    verified = Verdict("hit", "verified", 512, hit_params({"remote_num_tokens": 512}))
    assert choices.with_min_read(verified, never, FLOOR).reason == READ_NOT_WORTH
    # A default choice changes nothing.
    default = through_prefill(turn(512, 50), Speeds(None, None, None, None, None), FLOOR)
    assert choices.with_min_read(pending, default, FLOOR) is pending


def test_the_router_refuses_an_itl_budget_that_is_not_positive() -> None:
    with pytest.raises(UsageError, match=r"--itl-slo-ms must be > 0, got 0"):
        RouterConfig(prefill=("http://p",), decode=("http://d",), itl_slo_ms=0)


def test_an_engine_that_left_takes_its_rates_and_its_pairs_with_it() -> None:
    rates = Rates(lambda: 1.0)
    for _ in range(MIN_SAMPLES):
        rates.computed("http://p", 0, 4000, 4000, 0.5)
        rates.moved(P_TO_D, "http://p", "http://d", 4000, 0.01)
        rates.moved(D_TO_P, "http://d", "http://p2", 4000, 0.02)
    rates.forget("http://p")
    snap: Any = rates.snapshot()
    assert "http://p" not in snap["engines"]
    assert [(link["from"], link["to"]) for link in snap["links"]] == [("http://d", "http://p2")]


def test_the_choice_header_reads_back_as_written() -> None:
    c = choose(turn(8000, 2000, streams=12), FAST, FLOOR, SLO, CAP)
    name, value = choices.header(c)
    assert name == b"x-pd-kv-choice"
    said = KvChoice.parse(value.decode())
    assert said is not None and (said.source, said.basis, said.refused) == (DECODE_READ, "model", "itl")
    assert said.predicted_ms == round(c.ttft_ms or 0, 1)
    assert KvChoice.parse("decode_cache;basis=default") == KvChoice(DECODE_CACHE, "default")
    assert KvChoice.parse(None) is None and KvChoice.parse("basis=model") is None


def test_every_choice_series_is_exported_at_zero_and_a_model_choice_adds_its_predicted_and_measured_ttft() -> None:
    """/metrics per chosen source: a counter by basis, TTFT predicted and measured (model-chosen turns, whose
    prediction it is measured against), the |error|; each series there at 0 before the first warm turn."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    made = choices.Choices(registry, Rates(), SLO)

    def value(line_start: str) -> float:
        text = generate_latest(registry).decode()
        found = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)]
        assert found, (line_start, text)
        return sum(found)

    for source in choices.CHOSEN:
        for basis in ("model", "default"):
            assert value(f'pdctl_router_kv_choice_total{{basis="{basis}",source="{source}"}}') == 0
        for kind in ("predicted", "measured"):
            assert value(f'pdctl_router_kv_choice_ttft_seconds_count{{kind="{kind}",source="{source}"}}') == 0
    assert value("pdctl_router_kv_choice_error_seconds_count") == 0
    assert value('pdctl_router_kv_choice_local_refused_total{why="itl"}') == 0

    c = choose(turn(8000, 2000, streams=12), FAST, FLOOR, SLO, CAP)  # a read: the decode alone breaks the budget
    assert c.ttft_ms is not None and c.basis == "model"
    made.made(c, 0.5)
    made.made(Choice(DECODE_CACHE, None, 0.0, "default", FLOOR), 0.02)  # nothing predicted to compare
    read = f'source="{DECODE_READ}"'
    assert value(f'pdctl_router_kv_choice_total{{basis="model",{read}}}') == 1
    assert value(f'pdctl_router_kv_choice_ttft_seconds_sum{{kind="predicted",{read}}}') == pytest.approx(
        c.ttft_ms / 1000)
    assert value(f'pdctl_router_kv_choice_ttft_seconds_sum{{kind="measured",{read}}}') == pytest.approx(0.5)
    assert value("pdctl_router_kv_choice_error_seconds_sum") == pytest.approx(abs(0.5 - c.ttft_ms / 1000))
    assert value('pdctl_router_kv_choice_total{basis="default",source="decode_cache"}') == 1
    assert value('pdctl_router_kv_choice_ttft_seconds_count{kind="measured",source="decode_cache"}') == 0
    assert value('pdctl_router_kv_choice_local_refused_total{why="itl"}') == 1
    assert made.stats().measured_turns == 1
