#!/usr/bin/env python3
"""The tables in docs/results/README.md, from the committed per-request records of every H200 run.

Pools the warm turns (2 and 3) of legs with the same settings across runs, and sets them against the anchor
(vLLM's example proxy on the same host, shared/reference/h200x2-2026-11-30/bench-*.json) when it is there.

    python scripts/h200_tables.py [--anchor ../shared/reference/h200x2-2026-11-30]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "docs/results"
RUNS = {"h200x2": "run 1", "h200x2-b256": "run 1", "h200x2-run2": "run 2", "h200x2-graphs-local": "run 4",
        "h200x2-graphs-local-r2": "run 5"}
LENGTHS = (2000, 8000, 16000, 24000)
# leg name in a run -> the setting it measured
SETTINGS = {"off": "OFF, block 16", "on": "ON, block 16", "on-r2": "ON, block 16", "on-b64": "ON, block 64",
            "on-b128": "ON, block 128", "on-b256": "ON, block 256", "on-b256-r2": "ON, block 256",
            "on-local": "ON, block 256, local <= 1024", "on-graphs": "ON, block 256, CUDA graphs",
            "on-graphs-local": "ON, block 256, CUDA graphs, local <= 1024"}
ANCHOR = {"OFF, block 16": "bench-off.json", "ON, block 16": "bench-on.json", "ON, block 128": "bench-onb128.json"}


def warm_turns() -> dict[str, dict[int, list[float]]]:
    pooled: dict[str, dict[int, list[float]]] = {}
    for run in RUNS:
        for r in json.loads((ROOT / run / "requests.json").read_text()):
            if r["turn"] >= 1 and r["ttft_ms"] is not None:
                pooled.setdefault(SETTINGS[r["leg"]], {}).setdefault(r["length"], []).append(r["ttft_ms"])
    return pooled


def anchor_turns(folder: Path, name: str) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    path = folder / name
    if path.exists():
        for r in json.loads(path.read_text()):
            if r["turn"] >= 1:
                out.setdefault(r["target_len"], []).append(r["ttft_ms"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchor", type=Path, default=ROOT.parents[2] / "shared/reference/h200x2-2026-11-30")
    args = ap.parse_args()
    pooled = warm_turns()
    print("| setting | samples per length | " + " | ".join(f"L={n} median / mean" for n in LENGTHS) + " |")
    print("|---|---|" + "---|" * len(LENGTHS))
    def order(setting: str) -> tuple[bool, int, int]:  # OFF first, then by extra settings, then block size
        parts = setting.split(",")
        return setting.startswith("ON"), len(parts), int(parts[1].split()[-1])

    for setting in sorted(pooled, key=order):
        by = pooled[setting]
        cells = [f"{statistics.median(by[n]):.0f} / {statistics.mean(by[n]):.0f}" for n in LENGTHS]
        print(f"| pdctl {setting} | {len(by[LENGTHS[0]])} | " + " | ".join(cells) + " |")
        anchor = anchor_turns(args.anchor, ANCHOR.get(setting, "-"))
        if all(n in anchor for n in LENGTHS):
            cells = [f"{statistics.median(anchor[n]):.0f} / {statistics.mean(anchor[n]):.0f}" for n in LENGTHS]
            print(f"| anchor {setting} | {len(anchor[LENGTHS[0]])} | " + " | ".join(cells) + " |")
            diff = [f"{statistics.median(by[n]) / statistics.median(anchor[n]) - 1:+.0%} / "
                    f"{statistics.mean(by[n]) / statistics.mean(anchor[n]) - 1:+.0%}" for n in LENGTHS]
            print("| pdctl vs anchor | | " + " | ".join(diff) + " |")


if __name__ == "__main__":
    main()
