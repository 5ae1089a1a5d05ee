#!/usr/bin/env python3
"""What any scheduler can reach on two H200s for the agent workload (numbers printed, not a test): a bound from the
simulator's own step model (pdctl.sim.steps.H200_GRAPHS), for N sessions, per arrangement of the two GPUs:

  agg    one aggregated engine with N sessions (one GPU)
  agg2   two aggregated engines with N/2 sessions each (two GPUs, sessions split perfectly)
  pd     1P1D, every turn's prefill on the prefill GPU (bidirectional KV: D->P readback, P->D pull)
  pd*    1P1D with the best split of warm prefill work: a fraction f of warm turns through the prefill, the rest
         computed on the decode; f minimises the larger of the two GPUs' utilizations

Assumptions (each one checkable against pdctl/sim/steps.py and pdctl/bench/traffic/agent.py):
- The workload is the sweeps' agent profile at its means: 6 turns, a 6000-token shared system prompt, 300-token
  task; each later turn adds the previous 200 output tokens and a tool result (mean of 200-1000), think time the
  mean of 0.5-3 s between turns (none after the last). Turn k's prompt is L_k = 6300 + k * 800.
- Prefix caching everywhere: the shared prompt's 23 full blocks (256 tokens) are cached on every GPU, a cold turn
  computes the 412 tokens past them. A warm turn computed from the engine's own cache (aggregated, or local on a
  decode) recomputes the session's last partial block too (only full blocks are cached): prompt - full blocks of
  the last turn; one through a prefill that read the decode's KV back computes tool + 1 tokens; a decode fed by a
  prefill computes one token (vLLM recomputes the last prompt token).
- A GPU's work per turn is the step model's marginal cost of its slots (chunk_ms); the per-step fixed part
  (base_ms) is shared by everything in a step. A decoding engine steps back to back, so its step time (its TPOT)
  is tau = base / (1 - rho), rho = turn rate x work per turn ("utilization"; rho < 1 is the condition for a
  finite TPOT). A prefill-only GPU pays base + chunk per prefill (one step each: no batching) and queues as M/D/1.
- N sessions stay active (a finished one is replaced), each cycling: TTFT + 199 x TPOT + think. The turn rate and
  the TPOT are a fixed point of that cycle (solved by bisection). "demand" is rho at the unloaded cycle (TPOT =
  base, no queueing): what N sessions ask of the GPU; the fixed point's rho stays below 1 as TPOT stretches.
- A warm turn arrives in the middle of a step of its engine (half a step's wait) and its own step takes tau plus
  its chunk. TTFT is the mean over warm turns; "last" is the last turn with the tool result at its 90th percentile
  (a stand-in for p90). The router's own time is not counted; KV reads are DMA (no GPU time): the D->P readback
  reads the session's KV past the shared blocks, the P->D pull the new tokens, each one contiguous run, plus the
  readback's one-step wait (readback_wait_ms).
- KV, in blocks of 256, 896 per H200 (vLLM's measured 229,376 tokens for Qwen3-32B): every GPU that caches the
  shared prefix holds it once; a session holds its context past it (needed for its next warm hit, and pinned on a
  P/D decode until the next turn's readback); "pins" adds the last turns of N finished sessions, which a P/D decode
  keeps for decoder_kv_blocks_ttl (480 s) unread: what one point of N sessions leaves, and in a steady stream of
  sessions (rate/6 x 480 s of them) far more.

    python scripts/capacity_bound.py                          # N = 8 ... 96
    python scripts/capacity_bound.py --sessions 16,32,48 --slo 500
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pdctl.sim import steps, timing

COSTS = steps.H200_GRAPHS
BLOCK = 256
H200_BLOCKS = 229_376 // BLOCK
LIMIT = 512  # the largest N searched


@dataclass(frozen=True)
class Workload:
    turns: int = 6
    system_tokens: int = 6000
    task_tokens: int = 300
    output_tokens: int = 200
    tool_low: float = 200
    tool_high: float = 1000
    think_low_s: float = 0.5
    think_high_s: float = 3.0

    @property
    def shared(self) -> int:
        """Tokens of the shared prompt in full blocks: what every prefix cache holds once."""
        return self.system_tokens // BLOCK * BLOCK

    @property
    def think_s(self) -> float:
        """Mean think time per turn (none after a session's last turn)."""
        return (self.think_low_s + self.think_high_s) / 2 * (self.turns - 1) / self.turns

    def prompt(self, k: int, tool: float | None = None) -> float:
        """Turn k's prompt tokens, every tool result at the mean but this turn's, at `tool` where given."""
        first = float(self.system_tokens + self.task_tokens)
        if k == 0:
            return first
        mean = (self.tool_low + self.tool_high) / 2
        return first + k * (self.output_tokens + mean) + (mean if tool is None else tool) - mean


@dataclass(frozen=True)
class Turn:
    """One turn's work. `new`/`context`: what the engine holding the session's last turn computes, after what."""

    k: int
    prompt: float
    new: float
    context: float
    chunk_ms: float  # the new tokens' marginal cost in a step
    local_new: float  # what an engine computes from its own prefix cache: full blocks only
    local_ms: float
    decode_ms: float  # output tokens 2..O, one decode step each, marginal
    first_ms: float  # a P/D decode's one recomputed prompt token
    readback_tokens: float  # D->P: the session's KV past the shared blocks (0 on a cold turn)
    private_blocks: float  # the session's blocks past the shared ones, once the turn is done


@functools.cache
def turn(w: Workload, k: int, tool: float | None = None) -> Turn:
    prompt = w.prompt(k, tool)
    held = w.shared if k == 0 else w.prompt(k - 1) + w.output_tokens - 1
    new, o = prompt - held, w.output_tokens
    cached = held // BLOCK * BLOCK
    decode = sum(steps.chunk_ms(COSTS, 1, round(prompt) + i) for i in range(o - 1))
    return Turn(k, prompt, new, held, steps.chunk_ms(COSTS, round(new), round(held)),
                prompt - cached, steps.chunk_ms(COSTS, round(prompt - cached), round(cached)), decode,
                steps.chunk_ms(COSTS, 1, round(prompt) - 1), held - w.shared if k else 0.0,
                math.ceil((prompt + o - 1) / BLOCK) - w.shared // BLOCK)


def read_ms(tokens: float) -> float:
    return timing.kv_read_ms(timing.kv_bytes(round(tokens)), timing.DESCRIPTORS_PER_RUN)


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def tpot(rho: float) -> float:
    """A decoding engine's step time at work utilization rho."""
    return COSTS.base_ms / (1 - rho) if rho < 1 else math.inf


def md1_wait(rho: float, service_ms: float) -> float:
    return rho / (2 * (1 - rho)) * service_ms if rho < 1 else math.inf


@dataclass(frozen=True)
class Gpu:
    name: str
    rho: float
    tpot_ms: float | None  # decoding engines only
    kv_blocks: float  # shared prefix + the sessions' contexts (+ in-flight prefills on a prefill GPU)
    pin_blocks: float = 0.0  # a P/D decode's pins of N finished sessions' last turns


@dataclass(frozen=True)
class State:
    """An arrangement at one cycle time: what the cycle comes to, and each GPU's figures."""

    cycle_s: float
    ttft_ms: float  # mean over warm turns
    last_ms: float  # the last turn, tool result at its 90th percentile
    gpus: tuple[Gpu, ...]
    split: float | None = None  # pd*: the fraction of warm turns through the prefill


Model = Callable[[float], State]  # cycle time (s) -> the state it implies


def solve(model: Model) -> State:
    """The fixed point: the cycle time whose turn rate gives back that cycle (model(c).cycle_s falls as c grows)."""
    lo, hi = 1e-3, 1e7
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if model(mid).cycle_s > mid else (lo, mid)
    return model(hi)


def demand(model: Model) -> State:
    """What the sessions ask at the unloaded cycle (no queueing, TPOT = base)."""
    return model(model(math.inf).cycle_s)


def cycle_s(w: Workload, ttft_ms: float, tau: float) -> float:
    return (ttft_ms + (w.output_tokens - 1) * tau) / 1000 + w.think_s


def aggregated(w: Workload, sessions: float, name: str = "A") -> Model:
    turns = [turn(w, k) for k in range(w.turns)]
    work = mean([t.local_ms + t.decode_ms for t in turns])
    last = turn(w, w.turns - 1, w.tool_low + 0.9 * (w.tool_high - w.tool_low))
    kv = w.shared // BLOCK + sessions * mean([t.private_blocks for t in turns])

    def at(c: float) -> State:
        rho = sessions / c * work / 1000
        tau = tpot(rho)

        def ttft(t: Turn) -> float:
            return COSTS.request_ms + 1.5 * tau + t.local_ms

        mean_ttft = mean([ttft(t) for t in turns[1:]])
        return State(cycle_s(w, mean_ttft, tau), mean_ttft, ttft(last), (Gpu(name, rho, tau, kv),))
    return at


def two_aggregated(w: Workload, sessions: float) -> Model:
    one = aggregated(w, sessions / 2)

    def at(c: float) -> State:
        s = one(c)
        (g,) = s.gpus
        return State(s.cycle_s, s.ttft_ms, s.last_ms, (Gpu("A0", g.rho, g.tpot_ms, g.kv_blocks),
                                                        Gpu("A1", g.rho, g.tpot_ms, g.kv_blocks)))
    return at


def disaggregated(w: Workload, sessions: float, split: float = 1.0) -> Model:
    """1P1D; `split`: the fraction of warm turns through the prefill (cold turns always are), the rest on the decode."""
    turns = [turn(w, k) for k in range(w.turns)]
    last = turn(w, w.turns - 1, w.tool_low + 0.9 * (w.tool_high - w.tool_low))
    via = [1.0 if t.k == 0 else split for t in turns]
    p_work = [COSTS.base_ms + t.chunk_ms for t in turns]
    d_work = mean([t.decode_ms + f * t.first_ms + (1 - f) * t.local_ms for t, f in zip(turns, via, strict=True)])
    shared = w.shared // BLOCK
    d_kv = shared + sessions * mean([t.private_blocks for t in turns])
    pins = sessions * turns[-1].private_blocks

    def at(c: float) -> State:
        rate = sessions / c  # turns per second
        p_rho = rate * mean([f * x for f, x in zip(via, p_work, strict=True)]) / 1000
        d_rho = rate * d_work / 1000
        tau = tpot(d_rho)
        p_service = mean([x for f, x in zip(via, p_work, strict=True) if f > 0])
        wait = md1_wait(p_rho, p_service)

        def through_p(t: Turn) -> float:
            return (COSTS.request_ms + read_ms(t.readback_tokens) + steps.readback_wait_ms(COSTS) + wait
                    + COSTS.base_ms + t.chunk_ms + COSTS.request_ms + read_ms(t.new) + 1.5 * tau + t.first_ms)

        def local(t: Turn) -> float:
            return COSTS.request_ms + 1.5 * tau + t.local_ms

        def ttft(t: Turn) -> float:  # (a path no turn takes may be infinite: leave it out rather than 0 x inf)
            return (split * through_p(t) if split > 0 else 0.0) + ((1 - split) * local(t) if split < 1 else 0.0)

        mean_ttft = mean([ttft(t) for t in turns[1:]])
        in_flight = rate * (p_service + wait) / 1000 * mean([t.private_blocks for t in turns])
        gpus = (Gpu("P", p_rho, None, shared + in_flight), Gpu("D", d_rho, tau, d_kv, pins))
        return State(cycle_s(w, mean_ttft, tau), mean_ttft, ttft(last), gpus, split)
    return at


def best_split(w: Workload, sessions: float) -> State:
    """pd*: the split (to 0.01) whose fixed point has the lowest larger utilization, then the lowest TTFT; searched
    in steps of 0.05, then of 0.01 around the best."""

    def key(s: State) -> tuple[float, float]:
        return round(max(g.rho for g in s.gpus), 3), s.ttft_ms

    coarse = min((solve(disaggregated(w, sessions, f / 20)) for f in range(21)), key=key)
    centre = round((coarse.split or 0.0) * 100)
    fine = range(max(centre - 4, 0), min(centre + 4, 100) + 1)
    return min((coarse, *(solve(disaggregated(w, sessions, f / 100)) for f in fine)), key=key)


ARRANGEMENTS: dict[str, Callable[[Workload, float], Model]] = {
    "agg": aggregated, "agg2": two_aggregated, "pd": disaggregated}


def evaluate(w: Workload, name: str, sessions: float) -> tuple[State, State]:
    """(fixed point, demand) of one arrangement; pd*'s demand is at the fixed point's split."""
    if name == "pd*":
        s = best_split(w, sessions)
        return s, demand(disaggregated(w, sessions, s.split or 0.0))
    model = ARRANGEMENTS[name](w, sessions)
    return solve(model), demand(model)


def largest(w: Workload, name: str, ok: Callable[[State, State], bool], limit: int = LIMIT) -> int:
    """The largest N (up to `limit`) that is ok, every figure growing with N: doubling, then bisection."""
    good, bad = 0, limit + 1
    n = 1
    while n <= limit:
        if not ok(*evaluate(w, name, n)):
            bad = n
            break
        good, n = n, n * 2
    else:
        good = limit if ok(*evaluate(w, name, limit)) else good
    while bad - good > 1 and good < limit:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if ok(*evaluate(w, name, mid)) else (good, mid)
    return good


def fits(s: State, pins: bool) -> bool:
    return all(g.kv_blocks + (g.pin_blocks if pins else 0) <= H200_BLOCKS for g in s.gpus)


def _gpus(s: State, f: Callable[[Gpu], str]) -> str:
    return ", ".join(f"{g.name} {f(g)}" for g in s.gpus)


def report(w: Workload, sessions: Sequence[int], slo_ms: float) -> list[str]:
    lines = ["Per turn (step model h200-graphs, ms at speed 1; marginal costs, base_ms "
             f"{COSTS.base_ms} per step apart):", "",
             "| turn | prompt | new tokens after a readback | after | chunk ms | new tokens from the own cache | "
             "chunk ms | decode ms (199 tokens) | P/D decode's 1 token ms | readback tokens | private blocks |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in range(w.turns):
        t = turn(w, k)
        lines.append(f"| {k} | {t.prompt:.0f} | {t.new:.0f} | {t.context:.0f} | {t.chunk_ms:.1f} | "
                     f"{t.local_new:.0f} | {t.local_ms:.1f} | {t.decode_ms:.1f} | {t.first_ms:.2f} | "
                     f"{t.readback_tokens:.0f} | {t.private_blocks:.0f} |")
    lines += ["", "Warm-turn TTFT chain at zero load (turn 3):", ""]
    lines += [f"- {name}: {chain}" for name, chain in chains(w, turn(w, 3)).items()]
    for n in sessions:
        lines += ["", f"N = {n} sessions:", "",
                  "| arrangement | rho (fixed point) | rho demand | TPOT ms | warm TTFT mean / last ms | cycle s "
                  "| KV blocks (+ pins) of 896 |", "|---|---|---|---|---|---|---|"]
        for name in ("agg", "agg2", "pd", "pd*"):
            s, d = evaluate(w, name, n)
            label = f"pd* (f={s.split:.2f})" if s.split is not None and name == "pd*" else name
            tpots = ", ".join(f"{g.tpot_ms:.0f}" for g in s.gpus if g.tpot_ms is not None)
            kv = _gpus(s, lambda g: f"{g.kv_blocks:.0f}" + (f" (+{g.pin_blocks:.0f})" if g.pin_blocks else ""))
            lines.append(f"| {label} | {_gpus(s, lambda g: f'{g.rho:.2f}')} | {_gpus(d, lambda g: f'{g.rho:.2f}')} "
                         f"| {tpots} | {s.ttft_ms:.0f} / {s.last_ms:.0f} | {s.cycle_s:.1f} | {kv} |")
    lines += ["", f"Largest N (every smaller N too; SLO {slo_ms:g} ms):", "",
              "| arrangement | demand rho < 1 | demand rho < 0.8 | TTFT mean <= SLO | TTFT last <= SLO | KV fits "
              "| KV + pins fit |", "|---|---|---|---|---|---|---|"]
    checks: list[Callable[[State, State], bool]] = [
        lambda s, d: max(g.rho for g in d.gpus) < 1, lambda s, d: max(g.rho for g in d.gpus) < 0.8,
        lambda s, d: s.ttft_ms <= slo_ms, lambda s, d: s.last_ms <= slo_ms,
        lambda s, d: fits(s, False), lambda s, d: fits(s, True)]
    for name in ("agg", "agg2", "pd", "pd*"):
        found = [largest(w, name, ok) for ok in checks]
        lines.append(f"| {name} | " + " | ".join(f">= {n}" if n == LIMIT else str(n) for n in found) + " |")
    return lines


def chains(w: Workload, t: Turn) -> dict[str, str]:
    """The steps a warm turn waits for with nothing else running, each in ms."""
    c = COSTS
    agg = [("request", c.request_ms), ("step base", c.base_ms), ("chunk", t.local_ms)]
    pd = [("P request", c.request_ms), ("D->P readback", read_ms(t.readback_tokens)),
          ("readback wait", steps.readback_wait_ms(c)), ("P step base", c.base_ms), ("P chunk", t.chunk_ms),
          ("D request", c.request_ms), ("P->D pull", read_ms(t.new)), ("D step base", c.base_ms),
          ("D 1 token", t.first_ms)]

    def text(parts: list[tuple[str, float]]) -> str:
        return " + ".join(f"{n} {ms:.1f}" for n, ms in parts) + f" = {sum(ms for _, ms in parts):.0f} ms"
    return {"agg / agg2 / pd*'s local turns": text(agg), "pd / pd*'s turns through P": text(pd)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", default="8,16,24,32,48,64,96")
    p.add_argument("--slo", type=float, default=500.0, help="warm TTFT target, ms")
    p.add_argument("--tool-tokens", default="200-1000")
    p.add_argument("--think-s", default="0.5-3")
    args = p.parse_args()
    tool = [float(x) for x in args.tool_tokens.split("-")]
    think = [float(x) for x in args.think_s.split("-")]
    w = Workload(tool_low=tool[0], tool_high=tool[-1], think_low_s=think[0], think_high_s=think[-1])
    print("\n".join(report(w, [int(n) for n in args.sessions.split(",")], args.slo)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
