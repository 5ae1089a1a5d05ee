"""The rates the cost model (cost.py) predicts with, measured online by the router from what it already sees of
each turn; bounded memory (a few numbers per engine and per engine pair), O(1) per update and per lookup.

Each cost is a line, time = fixed + tokens x per-token (`Line`), fitted by exponentially weighted least squares
over the samples (`Fit`): the fixed part is the hop's own overhead (HTTP, scheduling, a read's handshake and the
wait for its completion), the per-token part the engine's or the link's speed.

    prefill   a prefill hop that read nothing, by the prompt's context length (CONTEXT_BUCKETS): its time against
              the tokens it computed plus those queued ahead of them there
    local     a local turn: the decode's time to first byte less one step, against its new tokens plus those queued
              ahead of them there; on a decode whose token budget the router knows, its whole time to first byte
              against the token slots of the steps that computed them (steps x chunk): on one H100 shared with the
              prefill a 500-token chunk hardly lengthened the eager decode's step, which a line of ms a token
              with a fixed part could not fit (docs/results/h100-1gpu-evict, fifth run)
    d_to_p    a prefill hop that read from the decode (per decode/prefill pair): what the hop took beyond its
              compute (the prefill's line), against the tokens read
    p_to_d    a pull (per prefill/decode pair): the decode's time to first byte less one step, against the tokens
              the prefill offered
    step      ms per output token of a decode's streams, by the streams in flight there (STREAM_BUCKETS): a
              relayed stream's (last - first byte) / (tokens - 1), its ITL as the router sees it
    gap       the largest gap between two relayed chunks of a decode's stream, by the same buckets: what its
              streams see at their worst anyway (on a GPU the prefill shares, 1.5-2x the step), which a local
              turn's stall is bounded against (cost.py)

    bias      per way (local: the decode alone; prefill: through a prefill), the cost model's measured / predicted
              TTFT of the turns it chose that way (BIAS_RANGE bounds a sample)

Each counts once it has MIN_SAMPLES samples and stops counting STALE_S after its last one (the model then falls
back to its safe default, which runs turns that measure it again). A decode or prefill that restarted (a new
generation in its pool) starts from nothing: its rates and its pairs' are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

ALPHA = 0.25
MIN_SAMPLES = 2
STALE_S = 120.0
CONTEXT_BUCKETS = (2048, 8192, 32768)  # bucket i: context <= CONTEXT_BUCKETS[i]; the last: longer
STREAM_BUCKETS = 7  # 1, 2-3, 4-7, ..., 64+ streams in flight
MIN_TOKENS = 32  # fewer tokens in a sample say more about the fixed costs than about a rate
SPREAD = 0.25  # a fixed part is fitted once the sizes seen spread at least this much (std / mean)
BIAS_RANGE = (0.25, 4.0)  # a turn's measured / predicted TTFT, bounded: one stalled turn moves the bias this far


@dataclass(frozen=True, slots=True)
class Line:
    """A cost in ms: fixed + tokens x per_token. `around` > 0: the sizes seen did not spread, so the line is the
    mean ms a token through the origin, known only around that many tokens (its fixed part is in the slope)."""

    fixed_ms: float
    per_token_ms: float
    around: float = 0.0

    def ms(self, tokens: float) -> float:
        return self.fixed_ms + tokens * self.per_token_ms

    @property
    def tokens_per_s(self) -> float:
        return 1000 / self.per_token_ms if self.per_token_ms > 0 else float("inf")


class Fit:
    """Exponentially weighted least squares of ms against tokens: the first samples weigh alike, then ALPHA. Too
    little spread in the sizes seen (or a line that would run below the origin) gives the line through the origin:
    the mean ms per token, no fixed part."""

    __slots__ = ("_line", "at", "mx", "mxx", "mxy", "my", "n")

    def __init__(self) -> None:
        self.mx = self.my = self.mxx = self.mxy = self.at = 0.0
        self.n = 0
        self._line: Line | None = None

    def add(self, tokens: float, ms: float, now: float) -> None:
        self.n += 1
        a = max(ALPHA, 1 / self.n)
        self.mx += a * (tokens - self.mx)
        self.my += a * (ms - self.my)
        self.mxx += a * (tokens * tokens - self.mxx)
        self.mxy += a * (tokens * ms - self.mxy)
        self.at = now
        self._line = self._fit() if self.n >= MIN_SAMPLES else None

    def _fit(self) -> Line | None:
        if self.mx <= 0:
            return None
        var = self.mxx - self.mx * self.mx
        if var > (SPREAD * self.mx) ** 2:
            slope = (self.mxy - self.mx * self.my) / var
            fixed = self.my - slope * self.mx
            if slope > 0 and fixed >= 0:
                return Line(fixed, slope)
        return Line(0.0, self.my / self.mx, self.mx)

    def line(self, now: float) -> Line | None:
        """The fitted cost (refitted at each sample), or None while it is not measured (too few samples, or
        stale)."""
        return self._line if now - self.at <= STALE_S else None


class Ewma:
    """One rate: its weighted mean, its samples, when it was last updated."""

    __slots__ = ("at", "n", "value")

    def __init__(self) -> None:
        self.value, self.n, self.at = 0.0, 0, 0.0

    def add(self, x: float, now: float) -> None:
        self.value = x if self.n == 0 else self.value + ALPHA * (x - self.value)
        self.n += 1
        self.at = now

    def get(self, now: float) -> float | None:
        """The rate, or None while it is not measured (too few samples, or stale)."""
        if self.n < MIN_SAMPLES or now - self.at > STALE_S:
            return None
        return self.value


def context_bucket(tokens: int) -> int:
    for i, edge in enumerate(CONTEXT_BUCKETS):
        if tokens <= edge:
            return i
    return len(CONTEXT_BUCKETS)


def stream_bucket(streams: int) -> int:
    return min(max(streams, 1).bit_length() - 1, STREAM_BUCKETS - 1)


@dataclass(slots=True)
class EngineRates:
    """One engine's rates, for one of its generations (incarnations)."""

    generation: int
    compute: list[Fit] = field(default_factory=lambda: [Fit() for _ in range(len(CONTEXT_BUCKETS) + 1)])
    step: list[Ewma] = field(default_factory=lambda: [Ewma() for _ in range(STREAM_BUCKETS)])
    gap: list[Ewma] = field(default_factory=lambda: [Ewma() for _ in range(STREAM_BUCKETS)])

    def compute_line(self, context: int, now: float) -> Line | None:
        """Its compute cost at this context length: its own bucket's, else the nearest measured one's."""
        b = context_bucket(context)
        own = self.compute[b].line(now)
        if own is not None:
            return own
        for d in range(1, len(self.compute)):
            for i in (b - d, b + d):
                if 0 <= i < len(self.compute):
                    v = self.compute[i].line(now)
                    if v is not None:
                        return v
        return None

    def step_ms(self, streams: int, now: float) -> float | None:
        """ms per step with `streams` in flight: its bucket, else the nearest measured one below it scaled up to
        nothing more (a step never gets shorter with more streams), else None."""
        return _by_streams(self.step, streams, now)

    def gap_ms(self, streams: int, now: float) -> float | None:
        """A stream's largest gap (ms) with `streams` in flight, found as step_ms finds the step."""
        return _by_streams(self.gap, streams, now)


def _by_streams(rates: list[Ewma], streams: int, now: float) -> float | None:
    b = stream_bucket(streams)
    for i in range(b, -1, -1):
        v = rates[i].get(now)
        if v is not None:
            return v
    for i in range(b + 1, STREAM_BUCKETS):
        v = rates[i].get(now)
        if v is not None:
            return v
    return None


class Rates:
    """Every engine's and engine pair's rates. `clock` is monotonic seconds (tests give their own)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._engines: dict[str, EngineRates] = {}
        self._pairs: dict[tuple[str, str, str], Fit] = {}  # (direction, from url, to url)
        self._bias: dict[str, Ewma] = {}  # "local" | "prefill" -> measured / predicted TTFT

    def engine(self, url: str, generation: int) -> EngineRates:
        """The engine's rates for this generation: a new generation (a restart) starts from nothing, its pairs too."""
        e = self._engines.get(url)
        if e is None:
            e = self._engines[url] = EngineRates(generation)
        elif e.generation != generation:
            e = self._engines[url] = EngineRates(generation)
            for key in [k for k in self._pairs if url in (k[1], k[2])]:
                del self._pairs[key]
        return e

    def pair(self, direction: str, src: str, dst: str) -> Fit:
        key = (direction, src, dst)
        e = self._pairs.get(key)
        if e is None:
            e = self._pairs[key] = Fit()
        return e

    def pair_line(self, direction: str, src: str, dst: str) -> Line | None:
        e = self._pairs.get((direction, src, dst))
        return e.line(self.clock()) if e is not None else None

    # Samples: a few multiplications each; nothing is allocated past an engine's or a pair's first.

    def computed(self, url: str, generation: int, context: int, tokens: int, seconds: float) -> None:
        if tokens >= MIN_TOKENS and seconds > 0:
            self.engine(url, generation).compute[context_bucket(context)].add(tokens, seconds * 1000, self.clock())

    def stepped(self, url: str, generation: int, streams: int, ms: float, gap_ms: float = 0.0) -> None:
        """A relayed stream's mean ms per token and its largest gap between two chunks (0: not known)."""
        if ms > 0:
            e, b, now = self.engine(url, generation), stream_bucket(streams), self.clock()
            e.step[b].add(ms, now)
            if gap_ms > 0:
                e.gap[b].add(gap_ms, now)

    def moved(self, direction: str, src: str, dst: str, tokens: int, seconds: float) -> None:
        if tokens >= MIN_TOKENS and seconds > 0:
            self.pair(direction, src, dst).add(tokens, seconds * 1000, self.clock())

    def predicted(self, way: str, predicted_ms: float, measured_ms: float) -> None:
        """A turn the model sent `way` ("local" or "prefill") came in at `measured_ms` against `predicted_ms`."""
        if predicted_ms > 0 and measured_ms > 0:
            lo, hi = BIAS_RANGE
            ratio = min(hi, max(lo, measured_ms / predicted_ms))
            self._bias.setdefault(way, Ewma()).add(ratio, self.clock())

    def bias(self, way: str) -> float:
        """How that way's turns measured against their predictions lately (1.0: not measured, or stale)."""
        e = self._bias.get(way)
        v = e.get(self.clock()) if e is not None else None
        return v if v is not None else 1.0

    def forget(self, url: str) -> None:
        """An engine gone from the pools: its rates and its pairs' go too."""
        self._engines.pop(url, None)
        for key in [k for k in self._pairs if url in (k[1], k[2])]:
            del self._pairs[key]

    def snapshot(self) -> dict[str, object]:
        """What /stats shows: each measured rate (rounded), by engine and by pair, and each way's bias."""
        now = self.clock()
        engines: dict[str, object] = {}
        for url, e in self._engines.items():
            lines = [(_context_label(i), v) for i, w in enumerate(e.compute) if (v := w.line(now)) is not None]
            step = {_stream_label(i): round(ms, 2) for i, w in enumerate(e.step) if (ms := w.get(now)) is not None}
            gap = {_stream_label(i): round(ms, 2) for i, w in enumerate(e.gap) if (ms := w.get(now)) is not None}
            engines[url] = {"generation": e.generation,
                            "tokens_per_s": {b: round(v.tokens_per_s, 1) for b, v in lines},
                            "fixed_ms": {b: round(v.fixed_ms, 2) for b, v in lines}, "step_ms": step,
                            "gap_ms": gap}
        pairs = [{"direction": d, "from": s, "to": t, "tokens_per_s": round(v.tokens_per_s, 1),
                  "fixed_ms": round(v.fixed_ms, 2)}
                 for (d, s, t), w in self._pairs.items() if (v := w.line(now)) is not None]
        bias = {way: round(b, 3) for way, e in self._bias.items() if (b := e.get(now)) is not None}
        return {"engines": engines, "links": pairs, "bias": bias}

    def gauges(self) -> list[tuple[str, str, str, float]]:
        """(kind, engine or pair, bucket, value) of every measured rate, for /metrics."""
        now = self.clock()
        out: list[tuple[str, str, str, float]] = []
        for url, e in self._engines.items():
            out += [("compute", url, _context_label(i), v.tokens_per_s) for i, w in enumerate(e.compute)
                    if (v := w.line(now)) is not None]
            out += [("step_ms", url, _stream_label(i), ms) for i, w in enumerate(e.step)
                    if (ms := w.get(now)) is not None]
            out += [("gap_ms", url, _stream_label(i), ms) for i, w in enumerate(e.gap)
                    if (ms := w.get(now)) is not None]
        out += [(d, f"{s} {t}", "", v.tokens_per_s) for (d, s, t), w in self._pairs.items()
                if (v := w.line(now)) is not None]
        return out


def _context_label(i: int) -> str:
    return f"<={CONTEXT_BUCKETS[i]}" if i < len(CONTEXT_BUCKETS) else f">{CONTEXT_BUCKETS[-1]}"


def _stream_label(i: int) -> str:
    lo = 1 << i
    return f"{lo}+" if i == STREAM_BUCKETS - 1 else (str(lo) if lo == 1 else f"{lo}-{2 * lo - 1}")
