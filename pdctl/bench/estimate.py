"""What a bench will cost before it starts: how many requests, and a rough wall time.

The time is a coarse model, not a measurement: every turn is priced as a full prefill of its prompt (the OFF
case, so the estimate errs long) plus its output tokens, at H200 rates for Qwen3-32B TP1 (the anchor run),
divided by `sim.speed` on simulated engines, plus a fixed cost per request and per leg (redeploy, warm-up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdctl.bench.workload import WorkloadSpec

PREFILL_MS_PER_TOKEN = 0.14
TPOT_MS = 38.0
REQUEST_OVERHEAD_MS = 60.0  # HTTP, the router and the client's own work: paid even by an infinitely fast engine
LEG_OVERHEAD_S = {"sim": 15.0, "vllm": 240.0}


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
    scale = 0.0 if engine == "sim" and math.isinf(speed) else (1.0 / speed if engine == "sim" else 1.0)
    per_conversation_ms = 0.0
    for length in spec.lengths:
        for turn in range(spec.turns):
            prompt = length + turn * (spec.user_tokens + spec.output_tokens)
            engine_ms = PREFILL_MS_PER_TOKEN * prompt + TPOT_MS * spec.output_tokens
            per_conversation_ms += engine_ms * scale + REQUEST_OVERHEAD_MS
    parallel = max(1, min(clients, spec.conversations))
    play_s = per_conversation_ms * spec.conversations / parallel / 1e3
    overhead_s = LEG_OVERHEAD_S.get(engine, 60.0) if redeploy else 0.0
    requests = len(spec.lengths) * spec.conversations * spec.turns
    return Estimate(legs, requests, legs * (play_s + overhead_s))


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"~{max(5, round(seconds / 5) * 5):.0f} s"
    if seconds < 5400:
        return f"~{round(seconds / 60):.0f} min"
    return f"~{seconds / 3600:.1f} h"
