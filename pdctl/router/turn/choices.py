"""Where the cost model (cost.py) meets the turn: the rates a turn's prediction takes, the samples a finished stage
gives the rates (rates.py), and each choice with its predicted and measured cost for the trace, /stats and
/metrics.

    pdctl_router_kv_choice_total{source,basis}          warm turns by the source the router chose (decode_cache,
                                                         decode_read, recomputed) and whether the model chose it
                                                         (model), the rule before it did (default), or it probed
                                                         the decode's local costs (probe)
    pdctl_router_kv_choice_local_refused_total{why}     turns the decode alone was refused: itl (its step would
                                                         break router.itl_slo_ms), stall (it would lengthen the
                                                         other streams' step past cost.LOCAL_STALL_RATIO x it),
                                                         slower (a prefill is cheaper), cap (over
                                                         router.local_prefill_tokens), unmeasured (the decode's
                                                         costs not yet measured, other streams on it)
    pdctl_router_kv_choice_ttft_seconds{source,kind}    the chosen source's TTFT, kind predicted or measured
    pdctl_router_kv_choice_error_seconds                |measured - predicted| TTFT of the model's choices
    pdctl_router_rate{kind,engine,bucket}               the rates the model predicts with (tokens/s; step_ms,
                                                         gap_ms: ms)

/stats `kv_choice` (pdctl.router.documents.KvChoiceStats) holds the mix, the refusals, a summary of the prediction
error over the last ERROR_WINDOW model-chosen turns, and the rates.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections import deque
from dataclasses import replace

from prometheus_client import CollectorRegistry, Gauge

from pdctl import prefix_check
from pdctl.defaults import LOCAL_STALL_RATIO
from pdctl.router.documents import KvChoiceStats
from pdctl.router.lean_metrics import Counter, Histogram
from pdctl.router.reasons import D_TO_P, DECODE_CACHE, DECODE_READ, P_TO_D, READ_NOT_WORTH, RECOMPUTED
from pdctl.router.turn.cost import Choice, Speeds, Turn, choose, chunk_of, through_prefill
from pdctl.router.turn.rates import Rates
from pdctl.router.turn.verify import Verdict, miss
from pdctl.router.upstream.pools import Upstream
from pdctl.router.wire import KvChoice

_S_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
ERROR_WINDOW = 256
CHOSEN = (DECODE_CACHE, DECODE_READ, RECOMPUTED)
BASES = ("model", "default", "probe")
REFUSALS = ("itl", "stall", "slower", "cap", "unmeasured")


def speeds(rates: Rates, decode: Upstream | None, prefill: Upstream, context: int, streams: int) -> Speeds:
    """The rates for a turn at `context` tokens on this pair, the decode's step and gap at `streams` + 1 (O(1))."""
    now = rates.clock()
    p = rates.engine(prefill.url, prefill.generation).compute_line(context, now)
    if decode is None:
        return Speeds(p, None, None, None, None)
    d = rates.engine(decode.url, decode.generation)
    return Speeds(p, d.compute_line(context, now), rates.pair_line(D_TO_P, decode.url, prefill.url),
                  rates.pair_line(P_TO_D, prefill.url, decode.url), d.step_ms(streams + 1, now),
                  d.gap_ms(streams + 1, now), rates.bias("prefill"), rates.bias("local"))


def local(rates: Rates, decode: Upstream, prefill: Upstream, held: int, missing: int, floor: int, slo_ms: float,
          cap: int, stall_ratio: float = LOCAL_STALL_RATIO, budget: int = 0) -> Choice:
    """The model's choice for a warm turn that could run on `decode` alone, whose steps compute at most `budget`
    tokens (0: not known)."""
    streams = decode.outstanding
    turn = Turn(held, missing, streams, decode.work, prefill.work, chunk_of(budget, streams))
    return choose(turn, speeds(rates, decode, prefill, held + missing, streams), floor, slo_ms, cap, stall_ratio)


def prefill_path(rates: Rates, decode: Upstream | None, prefill: Upstream, held: int, missing: int,
                 floor: int, before: Choice | None) -> Choice:
    """The model's choice through `prefill` (read or recompute), keeping why the decode alone was refused."""
    streams = decode.outstanding if decode is not None else 0
    turn = Turn(held, missing, streams, decode.work if decode is not None else 0, prefill.work)
    c = through_prefill(turn, speeds(rates, decode, prefill, held + missing, streams), floor)
    return replace(c, refused=before.refused) if before is not None and before.refused else c


def with_min_read(v: Verdict, c: Choice, floor: int) -> Verdict:
    """The verdict the prefill gets: a spec carrying this turn's break-even (the prefill reads only past it); a
    verdict the router verified becomes a recompute when the model says reading it is not worth it."""
    if c.basis != "model" or c.min_read == floor:
        return v
    spec = v.params.get(prefix_check.FIELD)
    if v.pending and isinstance(spec, dict):
        params = dict(v.params)
        params[prefix_check.FIELD] = {**spec, "min_read": c.min_read}
        return replace(v, params=params)
    if not v.pending and v.outcome != "miss" and v.tokens < c.min_read:
        return miss(READ_NOT_WORTH)
    return v


def header(c: Choice) -> tuple[bytes, bytes]:
    """The turn's X-PD-KV-Choice header (pdctl.router.wire.KvChoice)."""
    return KvChoice(c.source, c.basis, c.ttft_ms if c.basis == "model" else None, c.refused).raw()


class Choices:
    """The choices made, their predicted and measured costs, the rates: for /metrics and /stats (bounded)."""

    def __init__(self, registry: CollectorRegistry, rates: Rates, itl_slo_ms: float,
                 local_stall_ratio: float = LOCAL_STALL_RATIO) -> None:
        r = registry
        self.rates, self.itl_slo_ms, self.local_stall_ratio = rates, itl_slo_ms, local_stall_ratio
        self.chosen = Counter("pdctl_router_kv_choice", "Warm turns by the KV source the router chose (decode_cache: "
                              "the decode alone; decode_read: the prefill reads the history from the decode; "
                              "recomputed: the prefill computes it) and by basis: model (the cost model), default "
                              "(its rates not yet measured: the rule before it) or probe (a local turn that measures "
                              "the decode's costs).", ["source", "basis"], registry=r)
        self.refused = Counter("pdctl_router_kv_choice_local_refused", "Warm turns the decode alone was refused: itl "
                               "(its step would break router.itl_slo_ms), stall (it would lengthen the other streams' "
                               "step past --local-stall-ratio x it), slower (a prefill is cheaper), cap (over "
                               "router.local_prefill_tokens), unmeasured (its costs not yet measured, other streams "
                               "on the decode).", ["why"], registry=r)
        self.ttft = Histogram("pdctl_router_kv_choice_ttft_seconds", "The chosen source's time to first token, "
                              "predicted by the cost model or measured by the router (streamed turns).",
                              ["source", "kind"], buckets=_S_BUCKETS, registry=r)
        self.error = Histogram("pdctl_router_kv_choice_error_seconds", "|measured - predicted| time to first "
                               "token of the turns the cost model chose.", buckets=_S_BUCKETS, registry=r)
        self.rate = Gauge("pdctl_router_rate", "The rates the cost model predicts with: compute (tokens/s by "
                          "context bucket), step_ms (ms per decode step by streams in flight), gap_ms (a "
                          "stream's largest gap between two chunks, by streams in flight), d_to_p and p_to_d "
                          "(tokens/s per engine pair, engine \"<from> <to>\").", ["kind", "engine", "bucket"],
                          registry=r)
        self._chosen = {(s, b): self.chosen.labels(s, b) for s in CHOSEN for b in BASES}
        self._refused = {why: self.refused.labels(why) for why in REFUSALS}
        self._ttft = {(s, k): self.ttft.labels(s, k) for s in CHOSEN for k in ("predicted", "measured")}
        self.mix: Tally[str] = Tally()
        self.basis: Tally[str] = Tally()
        self.refusals: Tally[str] = Tally()
        self.errors: deque[float] = deque(maxlen=ERROR_WINDOW)  # measured - predicted, ms
        self.measured_turns = 0

    def made(self, c: Choice, measured_s: float | None) -> None:
        """A warm turn's choice, once its first token left (`measured_s`: its TTFT, None when not streamed)."""
        self.mix[c.source] += 1
        self.basis[c.basis] += 1
        self._chosen[c.source, c.basis].inc()
        if c.refused is not None:
            self.refusals[c.refused] += 1
            self._refused[c.refused].inc()
        if c.basis != "model" or c.ttft_ms is None:
            return
        self._ttft[c.source, "predicted"].observe(c.ttft_ms / 1000)
        if measured_s is None:
            return
        self._ttft[c.source, "measured"].observe(measured_s)
        self.rates.predicted("local" if c.source == DECODE_CACHE else "prefill", c.ttft_ms, measured_s * 1000)
        err = measured_s * 1000 - c.ttft_ms
        self.errors.append(err)
        self.error.observe(abs(err) / 1000)
        self.measured_turns += 1

    def stats(self) -> KvChoiceStats:
        errs = sorted(abs(e) for e in self.errors)
        n = len(errs)
        return KvChoiceStats(
            itl_slo_ms=self.itl_slo_ms,
            mix={s: self.mix.get(s, 0) for s in CHOSEN},
            basis={b: self.basis.get(b, 0) for b in BASES},
            local_refused={w: self.refusals.get(w, 0) for w in REFUSALS},
            measured_turns=self.measured_turns,
            error_window=n,
            error_mean_ms=round(sum(self.errors) / n, 2) if n else 0.0,
            error_abs_p50_ms=round(errs[n // 2], 2) if n else 0.0,
            error_abs_p90_ms=round(errs[min(n - 1, n * 9 // 10)], 2) if n else 0.0,
            rates=self.rates.snapshot(),
            local_stall_ratio=self.local_stall_ratio,
        )

    def exposition(self) -> None:
        self.rate.clear()
        for kind, engine, bucket, value in self.rates.gauges():
            self.rate.labels(kind, engine, bucket).set(value)
