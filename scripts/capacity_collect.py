"""Collect the points of capacity sweeps run line by line (scripts/gpu/sim-capacity.sh: one folder and one log per
line) into one table per topology, under a TTFT SLO and a TTFT + inter-token SLO, and one goodput plot each
(numbers printed, not a test; the points are as simulated as the sweeps that made them).

A line's leg is named by its capacity_sweep.py leg plus the overrides it ran with (--set), so two lines of the
same leg with other knobs stay apart.

    python scripts/capacity_collect.py docs/results/sim-capacity/run-f/f1 docs/results/sim-capacity/run-f/f2 \\
        --out docs/results/sim-capacity/run-f
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pdctl.bench.output import plots
from pdctl.bench.runner import capacity


def leg_name(log: Path, leg: str) -> str:
    """`leg` and the line's --set overrides (router.pin_budget_fraction=0.25 -> leg pin_budget_fraction=0.25)."""
    first = log.read_text().split("\n", 1)[0]
    words = shlex.split(first.split("capacity_sweep.py", 1)[-1])
    sets = [words[i + 1].split(".", 1)[-1] for i, w in enumerate(words[:-1]) if w == "--set"]
    return " ".join([leg, *sets])


def collect(folder: Path) -> dict[str, list[capacity.Point]]:
    """Every point under `folder`, by topology (1p1d, 2p2d), its leg named by its line."""
    found: dict[str, list[capacity.Point]] = {}
    for log in sorted(folder.glob("*.log"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0)):
        for legs in sorted((folder / log.stem).glob("*/**/legs.json")):
            shape = legs.relative_to(folder / log.stem).parts[0]
            for leg in json.loads(legs.read_text())["legs"]:
                for p in leg.get("capacity", []):
                    point = capacity.Point(**p)
                    found.setdefault(shape, []).append(replace(point, leg=leg_name(log, point.leg)))
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--slo", default="ttft_p90=500")
    p.add_argument("--slo2", default="ttft_p90=500,itl_p99=200", help="a second SLO the tables are read under")
    p.add_argument("--out", type=Path, help="write goodput-<topology>.png here")
    p.add_argument("--plot-legs", help="only these legs in the plot, comma-separated (default: every leg)")
    args = p.parse_args()
    slos = [capacity.Slo.parse(args.slo), capacity.Slo.parse(args.slo2)]
    shapes: dict[str, list[capacity.Point]] = {}
    for folder in args.folders:
        for shape, points in collect(folder).items():
            shapes.setdefault(shape, []).extend(points)
    for shape, points in shapes.items():
        points.sort(key=lambda q: (q.leg, q.sessions))
        print(f"\n## {shape} (simulated)\n")
        print("\n".join(capacity.table(points, slos[0])))
        legs = list(dict.fromkeys(q.leg for q in points))
        print(f"\n| leg | largest N within {slos[0].describe()} | within {slos[1].describe()} |\n|---|---|---|")
        for leg in legs:
            mine = [q for q in points if q.leg == leg]
            print(f"| {leg} | {capacity.largest_within(mine, slos[0])} | {capacity.largest_within(mine, slos[1])} |")
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            shown = args.plot_legs.split(",") if args.plot_legs else legs
            plots.plot_goodput([q for q in points if q.leg in shown], slos[0], f"{shape}: capacity (simulated)",
                               args.out / f"goodput-{shape}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
