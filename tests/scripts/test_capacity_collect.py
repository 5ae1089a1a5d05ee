"""scripts/capacity_collect.py: the points of sweeps run a line at a time, named by their line, in one table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "capacity_collect.py"


def point(leg: str, sessions: int, p90: float, itl: float) -> dict[str, object]:
    return {"leg": leg, "sessions": sessions, "requests": 6 * sessions, "failed": 0, "ttft_p50": p90 / 2,
            "ttft_p90": p90, "itl_p99": itl, "itl_max": itl}


def line(root: Path, i: int, args: str, shape: str, points: list[dict[str, object]]) -> None:
    (root / f"{i}.log").write_text(f"[{i}] capacity_sweep.py {args}\n$ -m pdctl bench ...\n")
    for p in points:
        where = root / str(i) / shape / f"s{p['sessions']}"
        where.mkdir(parents=True)
        (where / "legs.json").write_text(json.dumps({"legs": [{"name": p["leg"], "capacity": [p]}]}))


def test_lines_of_one_leg_with_other_overrides_stay_apart_under_both_slos(tmp_path: Path) -> None:
    line(tmp_path, 1, "--topologies 1p1d --legs on-load", "1p1d",
         [point("on-load", 32, 300, 80), point("on-load", 64, 450, 90), point("on-load", 80, 900, 90)])
    line(tmp_path, 2, "--topologies 1p1d --legs on-load --set router.pin_budget_fraction=0.25", "1p1d",
         [point("on-load", 64, 700, 90)])
    line(tmp_path, 10, "--topologies 1p1d --legs agg", "1p1d",
         [point("agg", 64, 300, 450), point("agg", 96, 420, 500)])
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--out", str(tmp_path / "plots")],
                         capture_output=True, text=True, check=True).stdout
    assert "| on-load | 64 | 64 |" in out
    assert "| on-load pin_budget_fraction=0.25 | 0 | 0 |" in out
    assert "| agg | 96 | 0 |" in out  # within the TTFT SLO, not the inter-token one
    assert (tmp_path / "plots" / "goodput-1p1d.png").stat().st_size > 0
