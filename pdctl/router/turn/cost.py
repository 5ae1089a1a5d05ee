"""The per-turn cost model: which source a warm turn's KV comes from, by its predicted cost (docs/router.md, "The
KV source of a warm turn").

For a warm turn whose decode holds `held` tokens of the prompt and lacks `missing`, from the costs the router
measures (rates.py: each a line, fixed ms + ms a token) and the load it has in flight on each engine:

    decode_cache  the decode alone: TTFT = local(queued + missing) + a step, its prefill a stall of queued +
                  missing x the local ms a token in the step of every other stream on that decode. Where the
                  decode's token budget is known (router.decode_batch_tokens, its max_num_batched_tokens) the
                  prompt is computed in chunks of that budget less a token for each of its streams, and the local
                  line is per token slot of those steps: TTFT = local(steps x chunk), each step chunk x the line's
                  ms a slot, its stall what that is beyond the streams' own step. Their gap becomes step + stall:
                  refused ("itl") when that is over ITL_HEADROOM of router.itl_slo_ms (the SLO bounds the largest
                  gap; the prediction is a mean), and ("stall") when it is over router.local_stall_ratio x the
                  largest gap those streams see anyway (rates.py `gap`; the step while that is not measured): a
                  turn through the prefill stalls them not at all, so a local one may make their worst gap little
                  worse than it is
    decode_read   through the prefill, which reads `held` from the decode (D->P): TTFT = prefill(its queued tokens
                  + missing) + read(held) + pull(held + missing) (P->D) + a step; no stall for the decode's streams
    recomputed    the same, computing `held` at the prefill instead of reading it
    prefill_cache the prefill's own prefix cache: the router cannot see it, the prefill can, and takes it whenever
                  it holds the history (pdctl.prefix_check); the prediction assumes it does not

It picks the least TTFT among the sources within those bounds, each way's TTFT scaled by how its recent turns
measured against their predictions (Speeds.via_bias, local_bias: the prefill's own cache, which the router cannot
see, makes the way through it cheaper than predicted). The other streams' stall is bounded per step, not priced
against the turn's own time: on a GPU the prefill shares, a turn through the prefill takes the same GPU time from
them (docs/router.md, "The KV source of a warm turn").
Between a read and a recompute the choice is the read's break-even (`min_read`): the fewest tokens beyond the
prefill's own cache worth reading, given to the prefill with the handle: a link no faster a token than the
prefill's compute never reads; else from the read's fixed cost over what it saves a token. Reads seen at one size
only (no fixed part fitted yet) that were slower than compute move the break-even to twice that size, so
longer histories still read and show whether the link's cost is its fixed part.
router.min_read_tokens is the floor of the break-even (and, where the read's fixed cost is not measured, that
cost in tokens of compute; 0: always read), router.local_prefill_tokens the most a turn may lack to run locally.

Until the costs it needs are measured (and again once they go stale) the model is not used: the turn reads past
min_read_tokens and, when its decode has no other stream, is placed by the `load` policy, the behaviour before the
model (`basis` "default"); beside other streams it goes through the prefill (refused "unmeasured"): a prefill of
unknown cost is not put in a busy decode's batch, whose stall every stream there pays.

A decode that is never idle still gets its local costs measured, by probes (`basis` "probe"): a turn runs there
beside other streams when no other local prompt is queued on it and its stall per step, priced at PROBE_MARGIN x
the prefill's measured compute for one chunk (both engines run the same model), keeps the step within the ITL
budget and, where the decode's budget is not known (a whole prompt in one step), within router.local_stall_ratio x
the largest gap: there only turns lacking a handful of tokens probe. Where it is known a probe's real stall is one
chunk a step, and probes stop once the costs they measure count (MIN_SAMPLES, until STALE_S).
With ratio 0 (the ITL budget alone) a turn lacking at most SAFE_LOCAL_TOKENS probes even before the prefill's rate
is measured.
A wrong estimate costs time, never correctness: every source serves the same verified KV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pdctl.defaults import LOCAL_STALL_RATIO, SAFE_LOCAL_TOKENS
from pdctl.router.reasons import DECODE_CACHE, DECODE_READ, RECOMPUTED
from pdctl.router.turn.rates import Line

NEVER_READ = 1 << 30  # a break-even no history reaches: the link is no faster than recompute
# The share of router.itl_slo_ms a predicted step may take. The SLO bounds each stream's largest gap (ITL p99), the
# prediction is a mean: the local line is fitted over a context bucket (2k-8k, 8k-32k) while a step's cost grows
# with the context each token attends to, and the host adds its own jitter. Planned to the whole budget, the
# largest gaps came out at 0.9-1.2x it (simulated 1P1D eviction, 3-8 sessions); a quarter kept back covers that.
ITL_HEADROOM = 0.75
# LOCAL_STALL_RATIO (router.local_stall_ratio's default): the most a local turn's chunk may lengthen the step of
# the decode's other streams, against the largest gap they see anyway: a turn through the prefill stalls them not
# at all (its KV arrives beside their steps), so ON default keeps their worst gap within this much of ON via
# prefill's. Planned to the ITL budget alone, single local turns of 1-2k tokens in one step set each run's largest
# gap at 1.6-3.3x ON via prefill's (simulated 1P1D eviction, 4-16 sessions); chunked by the decode's token budget
# each step carries a bounded part of them.
# A probe's stall, before the decode's own compute is measured, is priced at this many times the prefill's per
# token: the decode computes the same model's prompt, but beside its streams and at the conversation's whole
# context. Set to 1 for a day (the decode measured faster a token than the prefill on one shared H100: 51-60k
# tokens/s against 21-50k), the simulated 2P2D eviction sweep then probed with 433-1408 token prefills that broke
# its ITL SLO at 32 sessions (p99 202 ms; docs/results/sim-evict-1p1d, run9); on a decode of known budget the price
# guards the ITL budget alone, where twice it still probes a 500-token chunk on that GPU.
PROBE_MARGIN = 2.0
Basis = Literal["model", "default", "probe"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One warm turn as the model sees it: what its decode holds and lacks, and what is in flight where it could
    run (requests on the decode besides it; prompt tokens queued on the decode and on the prefill); `chunk`: the
    prompt tokens one decode step computes beside those streams (0: a whole prompt in one step)."""

    held: int
    missing: int
    streams: int
    decode_queued: int
    prefill_queued: int
    chunk: int = 0

    @property
    def local_tokens(self) -> int:
        """The prompt tokens the decode computes before this turn's first token: those queued there, and its own."""
        return self.decode_queued + self.missing

    @property
    def per_step(self) -> int:
        """The most of them one step computes."""
        return self.local_tokens if self.chunk <= 0 else min(self.local_tokens, self.chunk)

    @property
    def steps(self) -> int:
        """The steps that compute them (a turn lacking nothing still takes one)."""
        return max(1, -(-self.local_tokens // self.per_step)) if self.per_step > 0 else 1


def chunk_of(budget: int, streams: int) -> int:
    """The prompt tokens a decode step computes beside `streams` decoding streams within a token budget of
    `budget` (vLLM schedules running decodes first, a token each); 0: no budget known (the whole prompt at once)."""
    return max(budget - streams, 1) if budget > 0 else 0


@dataclass(frozen=True, slots=True)
class Speeds:
    """The measured costs a turn's prediction takes (None: not measured): the prefill's compute at this context,
    the decode's computing a local prompt, the D->P read and the P->D pull on this pair; the decode's step (ms)
    with one stream more than it has."""

    prefill: Line | None
    local: Line | None
    read: Line | None
    pull: Line | None
    step_ms: float | None
    gap_ms: float | None = None  # the largest gap the decode's streams see with no local prompt (None: unmeasured)
    # What the turns each way measured against what the model predicted (measured / predicted TTFT, recent turns;
    # 1: not yet measured). The way through a prefill is charged a read of the whole history the decode holds; the
    # prefill's own cache, which the router cannot see, often holds most of it: such turns come in at a third of
    # their prediction, which alone would run turns on the decode that a prefill serves as fast.
    via_bias: float = 1.0
    local_bias: float = 1.0


@dataclass(frozen=True, slots=True)
class Choice:
    """The model's answer: the source, its predicted TTFT (ms) and stall to the decode's other streams (ms, summed
    over them); the read's break-even for the prefill; why the decode alone was refused, if it was."""

    source: str
    ttft_ms: float | None
    others_ms: float
    basis: Basis
    min_read: int
    refused: str | None = None  # "itl": it would break the ITL budget; "stall": it would lengthen the other
    # streams' step past LOCAL_STALL_RATIO x it; "slower": a prefill is cheaper; "cap"; "unmeasured": beside other
    # streams while the decode's costs are not measured


def break_even(prefill: Line | None, read: Line | None, floor: int) -> tuple[int, Basis]:
    """The fewest tokens worth reading from the decode rather than computing: the read's fixed cost over what it
    saves a token (without a measured fixed cost: `floor` tokens of compute), at least `floor`. floor 0: always
    read (the operator's call)."""
    if floor <= 0:
        return 0, "default"
    if prefill is None or read is None:
        return floor, "default"
    saved = prefill.per_token_ms - read.per_token_ms
    if saved <= 0:
        if read.around:  # slower at the one size seen, its fixed part unknown: try reads of twice that size
            return max(floor, int(2 * read.around) + 1), "model"
        return NEVER_READ, "model"
    fixed = read.fixed_ms if read.fixed_ms > 0 else floor * prefill.per_token_ms
    return min(NEVER_READ, max(floor, int(fixed / saved) + 1)), "model"


def through_prefill(t: Turn, s: Speeds, floor: int) -> Choice:
    """The prefill path alone (the decode is not a candidate): read or recompute, and its predicted TTFT."""
    min_read, _ = break_even(s.prefill, s.read, floor)
    source = DECODE_READ if t.held > 0 and t.held >= min_read else RECOMPUTED
    ttft = _prefill_ttft(t, s, floor, source)
    return Choice(source, ttft, 0.0, "model" if ttft is not None else "default", min_read)


def _prefill_ttft(t: Turn, s: Speeds, floor: int, source: str) -> float | None:
    if s.prefill is None or s.pull is None:
        return None
    computed = t.prefill_queued + t.missing
    if source != DECODE_READ:
        history_ms = 0.0
        computed += t.held
    elif s.read is not None:
        history_ms = s.read.ms(t.held)
    else:  # a read of unmeasured cost: the floor's fixed cost and the prefill's own speed, no better
        history_ms = (floor + t.held) * s.prefill.per_token_ms
    return s.prefill.ms(computed) + history_ms + s.pull.ms(t.held + t.missing) + (s.step_ms or 0.0)


def choose(t: Turn, s: Speeds, floor: int, itl_slo_ms: float, local_cap: int,
           stall_ratio: float = LOCAL_STALL_RATIO) -> Choice:
    """The cheapest source within the ITL budget, the decode alone among them when it lacks at most `local_cap`
    tokens and, beside other streams, lengthens their step to at most `stall_ratio` times the largest gap they see
    anyway (0: no such bound, the ITL budget alone). basis "default" (a cost it needs not measured): the caller
    places the turn as before the model."""
    via = through_prefill(t, s, floor)
    if t.missing > local_cap:
        return _refused(via, "cap")
    if s.local is None or via.ttft_ms is None or s.step_ms is None:
        return unmeasured(t, via, stall_ratio, s, itl_slo_ms)
    # A local turn's own TTFT is about the steps that compute its prompt: where those came in slower than
    # predicted, the stall is priced up by as much; never down (the ITL budget is not relaxed on a good run).
    per_token = s.local.per_token_ms * max(1.0, s.local_bias)
    if t.chunk > 0:
        # The decode's budget known, its local line is per token slot of the steps that compute a prompt (rates.py):
        # a step with a chunk takes chunk x that, its stall what it takes beyond the step its streams see anyway.
        stall = max(0.0, t.chunk * per_token - s.step_ms)
        local_ttft = s.local.ms(t.steps * t.chunk)
    else:
        stall = t.per_step * per_token
        local_ttft = s.local.ms(t.local_tokens) + s.step_ms
    refused = _stalls(t, s, stall, itl_slo_ms, stall_ratio)
    if refused is not None:
        return _refused(via, refused)
    others = t.streams * t.steps * stall
    # Compared as each way has been measuring against its prediction; the choice says the model's own prediction.
    if local_ttft * s.local_bias <= via.ttft_ms * s.via_bias:
        return Choice(DECODE_CACHE, local_ttft, others, "model", via.min_read)
    return _refused(via, "slower")


def _stalls(t: Turn, s: Speeds, stall: float, itl_slo_ms: float, stall_ratio: float) -> str | None:
    """Why a step lengthened by `stall` ms breaks the other streams' bounds ("itl", "stall"), or None."""
    if t.streams == 0 or s.step_ms is None:
        return None
    stalled = s.step_ms + stall
    if stalled > ITL_HEADROOM * itl_slo_ms:
        return "itl"
    if stall_ratio > 0 and stalled > stall_ratio * max(s.step_ms, s.gap_ms or 0.0):
        return "stall"
    return None


def unmeasured(t: Turn, via: Choice, stall_ratio: float = LOCAL_STALL_RATIO, s: Speeds | None = None,
               itl_slo_ms: float = 0.0) -> Choice:
    """The safe default while a cost the decode's price needs is not measured: a turn on a decode with no other
    stream to stall is the `load` policy's to place (basis "default"); beside other streams it goes through the
    prefill (a stall of unknown length; any prefill in their batch lengthens their step several times over), unless
    it may probe the decode (`probe`): no other local prompt queued there and its stall, priced from the prefill's
    compute, within the bounds a measured one would have to keep."""
    if t.streams == 0:
        return Choice(via.source, None, 0.0, "default", via.min_read)
    if t.decode_queued == 0:
        probe = _probe(t, via, s, itl_slo_ms, stall_ratio)
        if probe is not None:
            return probe
    return Choice(via.source, None, 0.0, "default", via.min_read, "unmeasured")


def _probe(t: Turn, via: Choice, s: Speeds | None, itl_slo_ms: float, stall_ratio: float) -> Choice | None:
    """The decode alone for a turn that measures its local costs, when its stall is safe to guess: a step's chunk
    priced at PROBE_MARGIN x the prefill's compute, within the ITL budget and, on a decode of unknown budget (a whole
    prompt in one step), within stall_ratio x the largest gap (stall_ratio > 0; the step and the prefill's rate
    measured); with stall_ratio 0 and those not measured, lacking at most SAFE_LOCAL_TOKENS. None: through the
    prefill."""
    if s is None or s.prefill is None or s.step_ms is None:
        if stall_ratio <= 0 and t.missing <= SAFE_LOCAL_TOKENS:
            return Choice(DECODE_CACHE, None, 0.0, "probe", via.min_read)
        return None
    per_token = s.prefill.per_token_ms * PROBE_MARGIN
    # On a decode whose budget is known the price guards the ITL budget alone: its real stall a step is one chunk,
    # and it comes at most MIN_SAMPLES times a STALE_S, until the local costs it measures price the turns after it.
    bound = stall_ratio if t.chunk <= 0 else 0.0
    if _stalls(t, s, t.per_step * per_token, itl_slo_ms, bound) is not None:
        return None
    ttft = t.local_tokens * per_token + t.steps * s.step_ms
    return Choice(DECODE_CACHE, ttft, t.streams * t.missing * per_token, "probe", via.min_read)


def _refused(via: Choice, why: str) -> Choice:
    """Through the prefill, the decode alone refused: by the model (itl, slower), or by the cap (`via`'s basis)."""
    return Choice(via.source, via.ttft_ms, via.others_ms, via.basis if why == "cap" else "model", via.min_read, why)
