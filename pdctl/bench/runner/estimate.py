"""What a bench will cost before it starts: how many requests, and a rough wall time.

The time is a coarse model, not a measurement, made of the terms a bench spends its time on: per leg the
conversations (`clients` at a time, every turn priced as a full prefill of its prompt, the OFF case, plus its
output tokens, at H200 rates for Qwen3-32B TP1, the anchor run, divided by `sim.speed` on simulated engines, plus
a fixed cost per request), the two warm-up turns, and the redeploy; once per bench the CLI's start, the closing
stop and the report with its plots. `scripts/bench_estimate_check.py` compares it with real simulated runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdctl.bench.traffic.workload import WorkloadSpec

PREFILL_MS_PER_TOKEN = 0.14
TPOT_MS = 38.0
REQUEST_OVERHEAD_MS = 60.0  # HTTP, the router and the client's own work: paid even by an infinitely fast engine
# Redeploying a leg: stop, start engines and router, health. sim measured 4.7-6.6 s on a 2-core VM (docs).
LEG_OVERHEAD_S = {"sim": 5.0, "vllm": 240.0}
BENCH_OVERHEAD_S = 5.0  # once: the CLI's start, the closing stop, report.md and the plots (4.8-6.2 s measured)


@dataclass(frozen=True)
class Estimate:
    legs: int
    requests_per_leg: int
    seconds: float

    @property
    def requests(self) -> int:
        return self.legs * self.requests_per_leg

    def line(self, simulated: bool) -> str:
        engines = "simulated engines" if simulated else "real engines, from H200 rates"
        per_leg = f"{self.legs} leg(s) x {self.requests_per_leg}" if self.legs > 1 else f"{self.requests_per_leg}"
        return (
            f"bench: {self.requests} requests ({per_leg}, plus a short warm-up per leg); "
            f"rough estimate {_duration(self.seconds)} ({engines})"
        )


def estimate(spec: WorkloadSpec, legs: int, clients: int, engine: str, speed: float, redeploy: bool) -> Estimate:
    per_leg = play_s(spec, clients, engine, speed) + warmup_s(spec, engine, speed)
    if redeploy:
        per_leg += leg_overhead_s(engine, speed)
    requests = len(spec.lengths) * spec.conversations * spec.turns
    return Estimate(legs, requests, legs * per_leg + BENCH_OVERHEAD_S)


def _scale(engine: str, speed: float) -> float:
    """Engine time per H200 second: simulated engines run `sim.speed` times faster (infinitely: no time)."""
    if engine != "sim":
        return 1.0
    return 0.0 if math.isinf(speed) else 1.0 / speed


def turn_ms(prompt: int, output: int, scale: float) -> float:
    """One request: its prompt prefilled whole, its output decoded token by token, and the fixed overhead."""
    return (PREFILL_MS_PER_TOKEN * prompt + TPOT_MS * output) * scale + REQUEST_OVERHEAD_MS


def play_s(spec: WorkloadSpec, clients: int, engine: str, speed: float) -> float:
    """One leg's conversations: every turn of every conversation, `clients` conversations at a time."""
    scale = _scale(engine, speed)
    per_conversation_ms = sum(
        turn_ms(length + turn * (spec.user_tokens + spec.output_tokens), spec.output_tokens, scale)
        for length in spec.lengths for turn in range(spec.turns)
    )
    parallel = max(1, min(clients, spec.conversations))
    return per_conversation_ms * spec.conversations / parallel / 1e3


def warmup_s(spec: WorkloadSpec, engine: str, speed: float) -> float:
    """The warm-up before a leg's records: two turns of the first length, one client."""
    scale = _scale(engine, speed)
    first = spec.lengths[0]
    return (turn_ms(first, spec.output_tokens, scale)
            + turn_ms(first + spec.user_tokens + spec.output_tokens, spec.output_tokens, scale)) / 1e3


def leg_overhead_s(engine: str, speed: float) -> float:
    """Redeploying one leg: stop the processes, start the engines and the router, wait for their health."""
    return LEG_OVERHEAD_S.get(engine, 60.0)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"~{max(5, round(seconds / 5) * 5):.0f} s"
    if seconds < 5400:
        return f"~{round(seconds / 60):.0f} min"
    return f"~{seconds / 3600:.1f} h"
