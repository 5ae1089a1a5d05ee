"""Run a simulated prefill+decode pair through the anchor measurement's workload and print its TTFT curve
next to the H200 table (shared/reference/anchor-measurements.md). Exits 1 if a point is off by more than 20 %.

Per length: 2 conversations x 3 turns; turn 1 has L random tokens, later turns add the 64 generated tokens and
512 new ones; P gets max_tokens=1 (plus D's previous handle when bidirectional), D streams 64 tokens.
The TTFT is the median of turns 2-3, measured at the client from P's request to D's first token.

    python scripts/sim_curve.py                # --speed 1, about 3 minutes
    python scripts/sim_curve.py --speed 10     # quicker; times are scaled back by the speed
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.sim_procs import SERVED, sim_pair

# Median TTFT (ms) of turns 2-3, block size 16 (anchor-measurements.md).
MEASURED = {2000: (436, 272), 8000: (1193, 326), 16000: (2430, 477), 24000: (3816, 663)}
NEW_TOKENS, OUTPUT_TOKENS, TOLERANCE = 512, 64, 0.20
MISS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
        "remote_host": None, "remote_port": None}


def one_turn(client: httpx.Client, p_url: str, d_url: str, prompt: list[int],
             handle: dict[str, Any] | None) -> tuple[float, list[int], dict[str, Any] | None]:
    start = time.perf_counter()
    kv = {**handle, "do_remote_decode": True, "do_remote_prefill": False} if handle else MISS
    p = client.post(f"{p_url}/v1/completions",
                    json={"model": SERVED, "prompt": prompt, "max_tokens": 1, "kv_transfer_params": kv})
    p.raise_for_status()
    body = {"model": SERVED, "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True, "stream": True,
            "return_token_ids": True, "kv_transfer_params": p.json()["kv_transfer_params"]}
    ttft, out, d_handle = None, [], None
    with client.stream("POST", f"{d_url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            ids = chunk["choices"][0].get("token_ids") or []
            if ids and ttft is None:
                ttft = (time.perf_counter() - start) * 1e3
            out += ids
            if chunk["choices"][0]["finish_reason"] is not None:
                d_handle = chunk.get("kv_transfer_params")
    assert ttft is not None
    return ttft, out, d_handle


def run_leg(bidirectional: bool, speed: float, lengths: list[int], log_dir: Path) -> dict[int, float]:
    rng = random.Random(0)
    results: dict[int, float] = {}
    common = {"speed": speed, "block_size": 16, "num_blocks": 13000, "max_num_seqs": 8, "threshold": 64,
              "bidirectional": bidirectional}
    with sim_pair(log_dir / ("on" if bidirectional else "off"), **common) as pair, \
            httpx.Client(timeout=600) as client:
        for length in lengths:
            ttfts = []
            for _ in range(2):
                prompt = [rng.randrange(1000, 150000) for _ in range(length)]
                handle = None
                for turn in range(3):
                    ttft, out, handle = one_turn(client, pair.prefill_url, pair.decode_url, prompt,
                                                 handle if bidirectional else None)
                    if turn:
                        ttfts.append(ttft * speed)
                    prompt = prompt + out + [rng.randrange(1000, 150000) for _ in range(NEW_TOKENS)]
            results[length] = statistics.median(ttfts)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--lengths", default="2000,8000,16000,24000")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    with tempfile.TemporaryDirectory(prefix="sim-curve-") as tmp:
        (Path(tmp) / "off").mkdir()
        (Path(tmp) / "on").mkdir()
        off = run_leg(False, args.speed, lengths, Path(tmp))
        on = run_leg(True, args.speed, lengths, Path(tmp))
    print(f"simulated (pdctl.sim --speed {args.speed:g}) vs measured (H200, vLLM 0.26.0), median TTFT of turns 2-3")
    print(f"{'prompt':>7} | {'OFF meas':>8} {'OFF sim':>8} {'err':>6} | {'ON meas':>8} {'ON sim':>8} {'err':>6} "
          f"| {'OFF/ON meas':>11} {'OFF/ON sim':>10}")
    worst = 0.0
    for length in lengths:
        m_off, m_on = MEASURED[length]
        e_off, e_on = off[length] / m_off - 1, on[length] / m_on - 1
        worst = max(worst, abs(e_off), abs(e_on))
        print(f"{(length + 576) / 1000:>6.1f}k | {m_off:>8} {off[length]:>8.0f} {e_off:>+6.1%} | {m_on:>8} "
              f"{on[length]:>8.0f} {e_on:>+6.1%} | {m_off / m_on:>11.2f} {off[length] / on[length]:>10.2f}")
    ok = worst <= TOLERANCE
    print(f"worst error {worst:.1%}: {'within' if ok else 'OUTSIDE'} {TOLERANCE:.0%}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
