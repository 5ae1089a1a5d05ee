"""One prefill, one client, chat turns shaped like vLLM's multi-turn benchmark (512-token user turns): what ON
costs against OFF where the prefill's own prefix cache holds every conversation (issue 29). Simulated engines
(configs/local-sim.yaml on free ports, prefill prefix caching on, its default); printed, not a test.

Legs: off (bidirectional off), on (today's defaults: conditional disaggregation, the cheapest source of the
history with router.min_read_tokens), on-prefill (every warm turn through the prefill: router.local_prefill_tokens
0). Prints each leg's measured path (pdctl.bench.results.paths) and the median warm TTFT per length, ON less OFF.

    python scripts/kv_source_bench.py --speed 3 --lengths 2000,8000,16000,24000 --conversations 2 --turns 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pdctl.bench.results.paths import leg_path  # noqa: E402
from pdctl.bench.results.records import LegResult, RequestRecord  # noqa: E402
from pdctl.bench.results.stats import percentile  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

LEGS = ["off:connector.bidirectional_kv_xfer=false",
        "on:connector.bidirectional_kv_xfer=true",
        "on-prefill:connector.bidirectional_kv_xfer=true,router.local_prefill_tokens=0"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--speed", type=float, default=3.0)
    p.add_argument("--lengths", default="2000,8000,16000,24000")
    p.add_argument("--conversations", type=int, default=2)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--user-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "h29-kv-source")
    args = p.parse_args()
    data = yaml.safe_load((ROOT / "configs" / "local-sim.yaml").read_text())
    data["name"] = "h29-kv-source"
    data["prefill"] = [{"node": "local", "port": free_port(), "side_channel_port": free_port()}]
    data["decode"] = [{"node": "local", "port": free_port(), "side_channel_port": free_port()}]
    data["router"] = {**data["router"], "port": free_port()}
    data["sim"] = {**data["sim"], "speed": args.speed}
    with tempfile.TemporaryDirectory(prefix="h29-kv-source-") as tmp:
        data["work_dir"] = str(Path(tmp) / "work")
        topo = Path(tmp) / "topology.yaml"
        topo.write_text(yaml.safe_dump(data))
        cmd = [sys.executable, "-m", "pdctl", "bench", "-t", str(topo), "--api", "chat", "--clients", "1",
               "--lengths", args.lengths, "--conversations", str(args.conversations), "--turns", str(args.turns),
               "--user-tokens", str(args.user_tokens), "--output-tokens", str(args.output_tokens),
               "--out", str(args.out), "--json", *(a for leg in LEGS for a in ("--leg", leg))]
        print("$", " ".join(cmd[1:]).replace(str(topo), "<local-sim on free ports>"), flush=True)
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PDCTL_HOME": str(Path(tmp) / "home")})
        if not (args.out / "requests.json").exists():
            print(done.stdout[-3000:], done.stderr[-3000:])
            return 1
    records = [RequestRecord.from_json(r) for r in json.loads((args.out / "requests.json").read_text())]
    meta = {leg["name"]: leg for leg in json.loads((args.out / "legs.json").read_text())["legs"]}
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"\nsimulated (pdctl.sim, speed {args.speed:g}), 1 prefill + 1 decode, 1 client; median warm TTFT (ms)\n")
    medians: dict[str, dict[int, float]] = {}
    for name in meta:
        leg = LegResult(name, meta[name]["overrides"], meta[name]["bidirectional"], True,
                        records=[r for r in records if r.leg == name])
        leg.kv.transfers = meta[name]["kv_transfer"]["transfers"]
        leg.kv.bytes = meta[name]["kv_transfer"]["bytes"]
        leg.kv.source = meta[name]["kv_transfer"]["source"]
        path = leg_path(leg)
        medians[name] = {n: percentile([r.ttft_ms for r in leg.records if r.length == n and r.turn >= 1 and r.ok
                                        and r.ttft_ms is not None], 50) for n in lengths}
        print(f"{path.label}; {path.transfers_per_turn:.2f} transfers, {path.gib_per_turn:.3f} GiB per warm turn"
              + (f"  FLAG: {path.flag}" if path.flag else ""))
    print("\n| length | " + " | ".join(medians) + " | on - off | on-prefill - off |")
    print("|---" * (len(medians) + 3) + "|")
    for n in lengths:
        cells = [f"{medians[leg][n]:.1f}" for leg in medians]
        print(f"| {n} | " + " | ".join(cells) + f" | {medians['on'][n] - medians['off'][n]:+.1f} | "
              f"{medians['on-prefill'][n] - medians['off'][n]:+.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
