"""The rates the cost model (cost.py) predicts with, measured online by the router from what it already sees of
each turn; bounded memory (a few numbers per engine and per engine pair), O(1) per update and per lookup.

    prefill   tokens/s a prefill computes in a hop, by the prompt's context length (CONTEXT_BUCKETS): the tokens it
              computed plus those queued ahead of it there, over the hop's wall time, on hops that read nothing
    local     tokens/s a decode computes a local turn's prompt at (its tokens plus those queued ahead, over the
              decode's time to first byte, less one step)
    d_to_p    tokens/s a prefill reads a decode's KV at (per decode/prefill pair): the tokens read over what the
              hop took beyond its compute at the prefill's rate
    p_to_d    tokens/s a decode pulls a prefill's KV at (per prefill/decode pair): the tokens offered over the
              decode's time to first byte less one step
    step      ms per output token of a decode's streams, by the streams in flight there (STREAM_BUCKETS): a
              relayed stream's (last - first byte) / (tokens - 1), its ITL as the router sees it

Each is an exponentially weighted mean (ALPHA) that counts once it has MIN_SAMPLES samples and stops counting
STALE_S after its last one (the model then falls back to its safe default, which runs turns that measure it
again). A decode or prefill that restarted (a new generation in its pool) starts from nothing: its rates and its
pairs' are dropped.
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
    compute: list[Ewma] = field(default_factory=lambda: [Ewma() for _ in range(len(CONTEXT_BUCKETS) + 1)])
    step: list[Ewma] = field(default_factory=lambda: [Ewma() for _ in range(STREAM_BUCKETS)])

    def compute_rate(self, context: int, now: float) -> float | None:
        """Tokens/s at this context length: its own bucket, else the nearest measured one."""
        b = context_bucket(context)
        own = self.compute[b].get(now)
        if own is not None:
            return own
        for d in range(1, len(self.compute)):
            for i in (b - d, b + d):
                if 0 <= i < len(self.compute):
                    v = self.compute[i].get(now)
                    if v is not None:
                        return v
        return None

    def step_ms(self, streams: int, now: float) -> float | None:
        """ms per step with `streams` in flight: its bucket, else the nearest measured one below it scaled up to
        nothing more (a step never gets shorter with more streams), else None."""
        b = stream_bucket(streams)
        for i in range(b, -1, -1):
            v = self.step[i].get(now)
            if v is not None:
                return v
        for i in range(b + 1, STREAM_BUCKETS):
            v = self.step[i].get(now)
            if v is not None:
                return v
        return None


class Rates:
    """Every engine's and engine pair's rates. `clock` is monotonic seconds (tests give their own)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._engines: dict[str, EngineRates] = {}
        self._pairs: dict[tuple[str, str, str], Ewma] = {}  # (direction, from url, to url)

    def engine(self, url: str, generation: int) -> EngineRates:
        """The engine's rates for this generation: a new generation (a restart) starts from nothing."""
        e = self._engines.get(url)
        if e is None or e.generation != generation:
            e = self._engines[url] = EngineRates(generation)
            if self._pairs:
                for key in [k for k in self._pairs if url in (k[1], k[2])]:
                    del self._pairs[key]
        return e

    def pair(self, direction: str, src: str, dst: str) -> Ewma:
        key = (direction, src, dst)
        e = self._pairs.get(key)
        if e is None:
            e = self._pairs[key] = Ewma()
        return e

    def pair_rate(self, direction: str, src: str, dst: str) -> float | None:
        e = self._pairs.get((direction, src, dst))
        return e.get(self.clock()) if e is not None else None

    # Samples: each a division and an EWMA step; nothing is allocated past an engine's or a pair's first.

    def computed(self, url: str, generation: int, context: int, tokens: int, seconds: float) -> None:
        if tokens >= MIN_TOKENS and seconds > 0:
            self.engine(url, generation).compute[context_bucket(context)].add(tokens / seconds, self.clock())

    def stepped(self, url: str, generation: int, streams: int, ms: float) -> None:
        if ms > 0:
            self.engine(url, generation).step[stream_bucket(streams)].add(ms, self.clock())

    def moved(self, direction: str, src: str, dst: str, tokens: int, seconds: float) -> None:
        if tokens >= MIN_TOKENS and seconds > 0:
            self.pair(direction, src, dst).add(tokens / seconds, self.clock())

    def forget(self, url: str) -> None:
        """An engine gone from the pools: its rates and its pairs' go too."""
        self._engines.pop(url, None)
        for key in [k for k in self._pairs if url in (k[1], k[2])]:
            del self._pairs[key]

    def snapshot(self) -> dict[str, object]:
        """What /stats shows: each measured rate (rounded), by engine and by pair."""
        now = self.clock()
        engines: dict[str, object] = {}
        for url, e in self._engines.items():
            compute = {_context_label(i): round(v, 1) for i, w in enumerate(e.compute)
                       if (v := w.get(now)) is not None}
            step = {_stream_label(i): round(v, 2) for i, w in enumerate(e.step) if (v := w.get(now)) is not None}
            engines[url] = {"generation": e.generation, "tokens_per_s": compute, "step_ms": step}
        pairs = [{"direction": d, "from": s, "to": t, "tokens_per_s": round(v, 1)}
                 for (d, s, t), w in self._pairs.items() if (v := w.get(now)) is not None]
        return {"engines": engines, "links": pairs}

    def gauges(self) -> list[tuple[str, str, str, float]]:
        """(kind, engine or pair, bucket, value) of every measured rate, for /metrics."""
        now = self.clock()
        out: list[tuple[str, str, str, float]] = []
        for url, e in self._engines.items():
            out += [("compute", url, _context_label(i), v) for i, w in enumerate(e.compute)
                    if (v := w.get(now)) is not None]
            out += [("step_ms", url, _stream_label(i), v) for i, w in enumerate(e.step)
                    if (v := w.get(now)) is not None]
        out += [(d, f"{s} {t}", "", v) for (d, s, t), w in self._pairs.items() if (v := w.get(now)) is not None]
        return out


def _context_label(i: int) -> str:
    return f"<={CONTEXT_BUCKETS[i]}" if i < len(CONTEXT_BUCKETS) else f">{CONTEXT_BUCKETS[-1]}"


def _stream_label(i: int) -> str:
    lo = 1 << i
    return f"{lo}+" if i == STREAM_BUCKETS - 1 else (str(lo) if lo == 1 else f"{lo}-{2 * lo - 1}")
