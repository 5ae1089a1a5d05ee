"""Capacity sweeps on the simulator (numbers printed, not a test): agent sessions per leg on a simulated 1P1D and
2P2D, engines on the step model calibrated to H200s with CUDA graphs, block 256 (pdctl's GPU defaults).

Legs: off (no bidirectional transfer), on, on-local (conditional disaggregation: warm turns of at most
--local-tokens new tokens run on the decode alone), on-load (the same with router.local_policy=load: on the
decode only while it has fewer than --busy-streams requests in flight, or the prefill has as many), on-work (the
same with router.local_policy=work: on the decode while its in-flight prompt tokens are at most the prefill's plus
the hop's cost), agg (one aggregated engine with prefix caching per GPU of the P/D legs, behind pdctl's router in
its aggregated mode: a conversation's turns stay on one engine, new ones go to the least loaded), agg1 (one
aggregated engine alone: one GPU, its capacity times the GPUs is the bound it gives). Writes each
topology's `pdctl bench` output under --out and prints the largest number of sessions within the SLO per leg.
The prefill's prefix caching is the topology's default (on); `--set 'prefill[*].prefix_caching=false'` gives run D's
setting. The machine's cores are shared: numbers are noisy.

    python scripts/capacity_sweep.py                                   # about 10 minutes
    python scripts/capacity_sweep.py --topologies 1p1d --sessions 1,4,16 --out /tmp/cap
    python scripts/capacity_sweep.py --topologies 1p1d --legs on-local,on-work,agg --sessions 16,32 --out /tmp/cap
    python scripts/capacity_sweep.py --topologies 1p1d --legs on,agg --sessions 32,48 --fresh --out /tmp/cap
    python scripts/capacity_sweep.py --topologies 1p1d --legs agg,agg1 --sessions 8,16 --out /tmp/cap
    python scripts/capacity_sweep.py --profile eviction --sessions 4,8,16 --out /tmp/cap-eviction

`--profile eviction` (issue 29): where bidirectional transfer matters. 2P2D; each prefill's KV holds --prefill-
blocks blocks (fewer than the sessions' histories: its prefix cache evicts them), the decodes an H200's; `pdctl
bench --profile evict`, whose workload shape (pdctl.bench.runner.eviction.EVICT_AGENT: tool results, think times 2-8
s) and SLO (p90 TTFT <= 500 ms, ITL p99 <= 200 ms) it takes. Legs: the profile's own
(pdctl.bench.runner.eviction.legs: off, bidirectional off with prefill prefix caching on, the honest baseline; on-
prefill, every warm turn through a prefill, which reads from the decode what its cache lacks; on, today's defaults;
agg, aggregated engines on the same GPUs) and off-seed (prefix caching off on the prefill too: the seed's). Each
leg's report names the path it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pdctl.bench.runner import capacity, eviction
from pdctl.defaults import HANDLE_TTL_S, VLLM_DECODER_KV_BLOCKS_TTL_S
from pdctl.topology import load
from tests.support.ports import free_port as ephemeral_port

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LEGS = "off,on,on-local,on-load,on-work,agg"
_prefix = [""]  # --name-prefix: deployment names start with it
_next_port = [0]  # --port-base: listen ports handed out upwards from it; 0: any free ephemeral port


def free_port() -> int:
    """A port to listen on. Sweeps running at once on one host take theirs from separate ranges below the
    ephemeral range (--port-base), where no other sweep's outgoing connection can hold one."""
    if not _next_port[0]:
        return ephemeral_port()
    while True:
        port = _next_port[0]
        _next_port[0] += 1
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


# What one H200 holds for Qwen3-32B (256 KiB a token) at vLLM's default gpu_memory_utilization: "GPU KV cache size:
# 229,376 tokens" (docs/results/h200x2-run2/run/logs-tail.txt), 896 blocks of 256. Runs A-E used 2500.
H200_KV_BLOCKS = 229_376 // 256


def topology(shape: str, speed: float, max_num_seqs: int, work: Path, num_blocks: int = H200_KV_BLOCKS,
             tag: str = "") -> dict[str, Any]:
    """configs/local-sim.yaml on free ports, with `shape` (1p1d / 2p2d) instances and the step model."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "configs" / "local-sim.yaml").read_text())
    n = int(shape[0])
    data["name"] = f"{_prefix[0]}capacity-{shape}{tag}"
    data["prefill"] = [{"node": "local", "port": free_port(), "side_channel_port": free_port()} for _ in range(n)]
    data["decode"] = [{"node": "local", "port": free_port(), "side_channel_port": free_port()} for _ in range(n)]
    # A finished turn's blocks stay pinned on its decode for decoder_kv_blocks_ttl seconds of wall time, which
    # sim.speed compresses modelled time into: keep the pin 480 s of modelled time, as on the GPUs.
    ttl = max(math.ceil(VLLM_DECODER_KV_BLOCKS_TTL_S / speed), 2)
    data["connector"] = {**data["connector"], "decoder_kv_blocks_ttl": ttl}
    handle_ttl = ttl * HANDLE_TTL_S / VLLM_DECODER_KV_BLOCKS_TTL_S
    data["router"] = {**data["router"], "port": free_port(), "handle_ttl": handle_ttl}
    data["model"] = {**data["model"], "block_size": 256, "max_num_seqs": max_num_seqs}
    data["sim"] = {"speed": speed, "num_blocks": num_blocks, "args": ["--step-model", "h200-graphs"]}
    data["work_dir"] = str(work / "work")
    return data


def agg_leg(name: str, gpus: int) -> str:
    """An aggregated leg of one engine per GPU: as many decode instances on free ports (pdctl puts its router in
    front of two or more)."""
    engines = ", ".join(f"{{node: local, port: {free_port()}, side_channel_port: {free_port()}}}" for _ in range(gpus))
    return f"{name}:mode=aggregated,decode=[{engines}]"


def run(shape: str, args: argparse.Namespace, out: Path, tmp: Path) -> list[capacity.Point]:
    n = int(shape[0])
    path = tmp / f"{shape}.yaml"
    path.write_text(yaml.safe_dump(topology(shape, args.speed, args.max_num_seqs, tmp / shape, args.num_blocks,
                                            f"-{args.tag}" if args.tag else "")))
    legs = ["off:connector.bidirectional_kv_xfer=false,router.local_prefill_tokens=0",
            "on:connector.bidirectional_kv_xfer=true,router.local_prefill_tokens=0",
            f"on-local:connector.bidirectional_kv_xfer=true,router.local_prefill_tokens={args.local_tokens},"
            "router.local_policy=always",
            f"on-load:connector.bidirectional_kv_xfer=true,router.local_prefill_tokens={args.local_tokens},"
            f"router.local_policy=load,router.local_busy_streams={args.busy_streams}",
            f"on-work:connector.bidirectional_kv_xfer=true,router.local_prefill_tokens={args.local_tokens},"
            "router.local_policy=work",
            agg_leg("agg", 2 * n), agg_leg("agg1", 1)]
    if args.profile == "eviction":
        small = f"extra_args.prefill=[--num-gpu-blocks,'{args.prefill_blocks}']"
        shared = eviction.legs(load(path))
        legs = [f"{leg.name}:{','.join(leg.overrides if leg.name == 'agg' else [*leg.overrides, small])}"
                for leg in shared]
        legs.append(f"off-seed:connector.bidirectional_kv_xfer=false,prefill[*].prefix_caching=false,{small}")
        if args.legs == DEFAULT_LEGS:
            args.legs = "off,off-seed,on-prefill,on,agg"
    legs = [leg for leg in legs if leg.split(":", 1)[0] in args.legs.split(",")]
    legs = [leg if leg.startswith(("agg:", "agg1:")) else ",".join([leg, *args.set]) for leg in legs]
    if not args.fresh:
        return bench(shape, args.sessions, legs, args, out / shape, path, tmp)
    # A point inherits the decode blocks that earlier points' last turns pinned (decoder_kv_blocks_ttl): one
    # bench per session count starts every point on fresh engines.
    return [p for n in args.sessions.split(",")
            for p in bench(shape, n, legs, args, out / shape / f"s{n}", path, tmp)]


def bench(shape: str, sessions: str, legs: list[str], args: argparse.Namespace, out: Path, path: Path,
          tmp: Path) -> list[capacity.Point]:
    profile = ["--profile", "evict"] if args.profile == "eviction" else []
    cmd = [sys.executable, "-m", "pdctl", "bench", "-t", str(path), *profile, "--sweep", f"sessions={sessions}",
           "--slo", args.slo, "--turns", str(args.turns), "--output-tokens", str(args.output_tokens),
           "--system-tokens", str(args.system_tokens), "--tool-tokens", args.tool_tokens, "--think-s", args.think_s,
           "--arrival-rate", str(args.arrival_rate), "--runs", str(args.runs), "--out", str(out), "--json"]
    for leg in legs:
        cmd += ["--leg", leg]
    print("$", " ".join(cmd[1:]).replace(str(path), f"<{shape} topology>"), flush=True)
    env = {**os.environ, "PDCTL_HOME": str(tmp / shape / "home")}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if not (out / "legs.json").exists():
        print(done.stdout[-3000:], done.stderr[-3000:])
        raise SystemExit(f"pdctl bench on {shape} wrote no result (exit {done.returncode})")
    (out / f"{shape}.yaml").write_text(path.read_text())
    meta = json.loads((out / "legs.json").read_text())
    return [capacity.Point(**p) for leg in meta["legs"] for p in leg.get("capacity", [])]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--topologies", default="1p1d,2p2d")
    p.add_argument("--sessions", default="1,2,4,8,16,32")
    p.add_argument("--slo", default="ttft_p90=500")
    p.add_argument("--speed", type=float, default=10.0)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--output-tokens", type=int, default=200)
    p.add_argument("--system-tokens", type=int, default=6000)
    p.add_argument("--tool-tokens", default="200-2000")
    p.add_argument("--think-s", default="0.5-3")
    p.add_argument("--arrival-rate", type=float, default=2.0)
    p.add_argument("--runs", type=int, default=2, help="plays per point (2: a third when the two differ > 10 %%)")
    p.add_argument("--local-tokens", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=8, help="per engine (8: the H200 runs' setting)")
    p.add_argument("--num-blocks", type=int, default=H200_KV_BLOCKS,
                   help=f"KV blocks of 256 tokens per engine ({H200_KV_BLOCKS}: what an H200 holds for Qwen3-32B)")
    p.add_argument("--busy-streams", type=int, default=4, help="on-load: router.local_busy_streams")
    p.add_argument("--legs", default=DEFAULT_LEGS, help="which legs, comma-separated")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a topology override for every P/D leg, e.g. 'prefill[*].prefix_caching=false' (repeatable)")
    p.add_argument("--fresh", action="store_true",
                   help="one pdctl bench per session count (fresh engines per point), each under OUT/SHAPE/sN")
    p.add_argument("--port-base", type=int, default=0,
                   help="hand out listen ports upwards from this one (0: free ephemeral ports); sweeps at once: "
                   "ranges apart, below the ephemeral range (e.g. 20000, 20500, ...)")
    p.add_argument("--tag", default="", help="deployment name suffix: sweeps running at once need distinct names "
                   "(pdctl up stops the processes of a deployment of the same name)")
    p.add_argument("--name-prefix", default="", help="deployment names start with it (an engineer's tag)")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "pdctl-capacity")
    p.add_argument("--profile", choices=("default", "eviction"), default="default",
                   help="eviction: 2P2D, prefills whose cache cannot hold the sessions, off-cached/off-seed/on")
    p.add_argument("--prefill-blocks", type=int, default=160,
                   help="--profile eviction: KV blocks of 256 tokens per prefill (160: 41k tokens)")
    args = p.parse_args()
    if args.profile == "eviction":
        shape = eviction.EVICT_AGENT
        args.topologies = "2p2d" if args.topologies == "1p1d,2p2d" else args.topologies
        args.slo = eviction.EVICT_SLO if args.slo == "ttft_p90=500" else args.slo
        args.think_s = f"{shape.think_s.low:g}-{shape.think_s.high:g}" if args.think_s == "0.5-3" else args.think_s
        args.tag = args.tag or "eviction"
    _next_port[0] = args.port_base
    _prefix[0] = args.name_prefix
    slo = capacity.Slo.parse(args.slo)
    with tempfile.TemporaryDirectory(prefix="capacity-") as tmp:
        for shape in args.topologies.split(","):
            points = run(shape, args, args.out, Path(tmp))
            gpus = 2 * int(shape[0])
            print(f"\n## {shape} (simulated, {gpus} GPUs for P/D legs and agg, 1 for agg1), SLO {slo.describe()}\n")
            print("\n".join(capacity.table(points, slo)))
            best = {leg: capacity.largest_within([q for q in points if q.leg == leg], slo)
                    for leg in dict.fromkeys(q.leg for q in points)}
            pd_legs = [leg for leg in best if leg not in ("agg", "agg1")]
            if not pd_legs:
                continue
            top = max(pd_legs, key=lambda leg: best[leg])
            agg = best.get("agg", 0)  # measured: one aggregated engine per GPU behind the router
            agg1_bound = best.get("agg1", 0) * gpus  # one engine's sessions times the GPUs, split perfectly
            base = "off"
            print(f"\nbest P/D leg: {top} with {best[top]} sessions; {base} {best.get(base, 0)}; "
                  f"agg {agg} on {gpus} GPUs; agg1 {best.get('agg1', 0)} on 1 GPU, at most {agg1_bound} on {gpus}")
            off = best.get(base, 0)
            print(f"{top}/{base} = {best[top] / off:.2f}x" if off else f"{top}/{base}: {base} holds no session")
            if "agg" in best:
                print(f"{top}/agg on {gpus} GPUs = {best[top] / agg:.2f}x" if agg else "agg holds no session")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
