"""Where a warm turn's TTFT goes, stage by stage, from public surfaces only.

    router in     the router's own time before the prefill hop: body, JSON, conversation, verification
                  (`X-PD-Router-In-Ms`)
    prefill hop   the prefill request less its D->P read (`X-PD-Prefill-Ms` less the read)
    D->P read     the prefill's NIXL read time per reusing turn (its `vllm:nixl_xfer_time_seconds`)
    P->D pull     the decode's mean NIXL read (its `vllm:nixl_xfer_time_seconds`); every turn pulls, so the
                  mean includes each conversation's cold first pull and overstates a warm one's a little
    decode first  decode request to its first byte, less the pull (`X-PD-Decode-Ms` less the pull)
    router out    what is left of the client's TTFT: relaying, the client's own hops

Means over a length's successful warm turns (turn >= 1); a stage a leg cannot see (no router, no metrics) is 0.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from pdctl.bench.results.records import KvTransfer, LegResult, RequestRecord
from pdctl.bench.results.stats import lengths_of
from pdctl.router.wire import DECODE_LOCAL

STAGES = ("router in", "prefill hop", "D->P read", "P->D pull", "decode first token", "router out")


@dataclass(frozen=True)
class StageRow:
    leg: str
    length: int
    turns: int
    ttft_ms: float
    stages: dict[str, float]


def stage_rows(legs: list[LegResult]) -> list[StageRow]:
    rows = []
    for leg in legs:
        for length in lengths_of(leg.records):
            warm = [r for r in leg.records if r.length == length and r.turn >= 1 and r.ok and r.ttft_ms is not None]
            if warm:
                rows.append(_row(leg, length, warm))
    return rows


def _row(leg: LegResult, length: int, warm: list[RequestRecord]) -> StageRow:
    ttft = statistics.fmean(float(r.ttft_ms or 0.0) for r in warm)
    # Means over every warm turn: a turn that read nothing (its history in the prefill's cache, or on its decode
    # alone) adds 0 to the D->P read, and a turn on its decode alone pulled nothing from a prefill (issue 29).
    read = _per(leg.kv_by_length.get(length), len(warm)) if leg.bidirectional else 0.0
    pulls = leg.pull_by_length.get(length)
    through = sum(1 for r in warm if r.reuse_reason != DECODE_LOCAL)
    pull = pulls.avg_xfer_ms * through / len(warm) if pulls is not None else 0.0
    router_in = _mean(warm, "router_in_ms")
    prefill = _mean(warm, "prefill_ms")
    decode = _mean(warm, "decode_ms")
    read = min(read, prefill) if prefill else 0.0
    pull = min(pull, decode) if decode else 0.0
    stages = {
        "router in": router_in,
        "prefill hop": prefill - read,
        "D->P read": read,
        "P->D pull": pull,
        "decode first token": decode - pull,
        "router out": max(0.0, ttft - router_in - prefill - decode),
    }
    return StageRow(leg.name, length, len(warm), ttft, stages)


def _mean(recs: list[RequestRecord], name: str) -> float:
    xs = [float(v) for r in recs if (v := getattr(r, name)) is not None]
    return statistics.fmean(xs) if xs else 0.0


def _per(kv: KvTransfer | None, turns: int) -> float:
    """One span's read time per turn of `turns` (the warm turns: a mean over them)."""
    if kv is None or not turns or math.isnan(kv.xfer_ms):
        return 0.0
    return kv.xfer_ms / turns


def markdown(rows: list[StageRow], axis: str = "length") -> list[str]:
    lines = ["", "## Where warm-turn TTFT goes (ms, mean of turns 2+): per stage", ""]
    lines += [f"| leg | {axis} | turns | TTFT | " + " | ".join(STAGES) + " |", "|---" * (4 + len(STAGES)) + "|"]
    for r in rows:
        cells = [f"{r.stages[s]:.1f}" for s in STAGES]
        lines.append(f"| {r.leg} | {r.length} | {r.turns} | {r.ttft_ms:.1f} | " + " | ".join(cells) + " |")
    return lines
