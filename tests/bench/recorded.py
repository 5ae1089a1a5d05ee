"""The real two-H200 run (samples/bench-*.json) as bench records, for report and guard tests."""

from __future__ import annotations

import json
from pathlib import Path

from pdctl.bench.results.records import BenchResult, KvTransfer, LegResult, RequestRecord

SAMPLES = Path(__file__).parent / "samples"


def leg(name: str, bidirectional: bool) -> LegResult:
    records = []
    for raw in json.loads((SAMPLES / f"bench-{name}.json").read_text()):
        warm = raw["turn"] >= 1
        records.append(
            RequestRecord(
                leg=name,
                length=raw["target_len"],
                conversation_id=raw["conversation_id"],
                turn=raw["turn"],
                api="completions",
                status=200,
                ttft_ms=raw["ttft_ms"],
                latency_ms=raw["e2e_ms"],
                tpot_ms=(raw["e2e_ms"] - raw["ttft_ms"]) / (raw["output_tokens"] - 1),
                input_num_tokens=raw["input_num_tokens"],
                output_num_tokens=raw["output_tokens"],
                prefill_ms=raw["ttft_ms"] * 0.8,
                reuse=("hit" if bidirectional else "miss") if warm else "miss",
            )
        )
    return LegResult(name, [f"connector.bidirectional_kv_xfer={str(bidirectional).lower()}"], bidirectional,
                     simulated=False, records=records)


def bench(simulated: bool = False) -> BenchResult:
    on = leg("on", True)
    on.kv = KvTransfer(transfers=16, xfer_ms=2400.0, bytes=6e10, source="log")
    result = BenchResult("h200x2-local", simulated, {"api": "completions", "turns": 3}, [leg("off", False), on])
    result.started_at = "2026-11-30T16:20:00"
    return result
