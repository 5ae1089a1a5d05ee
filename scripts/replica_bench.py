#!/usr/bin/env python3
"""Routers behind HAProxy, on simulated engines (results are simulated; printed, not asserted).

`pdctl up` (the library, local transport) of 3 routers behind a real HAProxy on simulated 1P1D, then phases of
`--streams` concurrent 4-turn streaming conversations, each `--seconds` long:

  one-router   straight to router-0 (the same engines, one router: the baseline)
  3-routers    through the load balancer
  scale-out    through the LB while `up` grows 1P1D to 2P2D (live membership)
  rolling      through the LB while `up --restart --rolling` replaces every engine and router of 2P2D, one at a
               time
  router-kill  through the LB, router-1 SIGKILLed at 1/3 and brought back by `up`
  routers      through the LB while `up` takes the routers 3 -> 2 -> 3 (HAProxy reloaded, nothing restarted)

Per phase: requests, failed requests (and how many had started on the killed router), turns 2+ hit rate, warm
TTFT p50/p90 (turns 2+ that hit), the simulator's oracle (corrupt reuses, summed over the engines running then).

    python scripts/replica_bench.py --streams 8 --seconds 10
    python scripts/replica_bench.py --streams 1000 --seconds 60 --only router-kill   # the issue's scale

`--only` runs the one-router baseline and the phases named (comma-separated).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rich.console import Console

from pdctl.lifecycle import UpOptions, down, up
from pdctl.lifecycle.hosts.engine_key import read_key
from pdctl.remote.local import LocalTransport
from pdctl.state import StateStore
from pdctl.topology import Topology, load
from tests.lifecycle.test_router_replicas import free_block
from tests.support.load import Load, Tally, corrupt_reuses
from tests.support.ports import free_port
from tests.support.sim_topology import sim_yaml


def topology(work: Path, ports: list[tuple[int, int]], n: int, router: int, replica_port: int) -> str:
    return sim_yaml("h34-bench", work, ports[0:n], ports[2:2 + n],
                    f"port: {router}, replicas: 3, replica_port: {replica_port}")


def report(name: str, tally: Tally, oracle: float, killed_at: float | None = None) -> None:
    warm = sorted(r.ttft for r in tally.requests if r.ok and r.turn and r.ttft is not None)
    lost = [r for r in tally.requests if not r.ok]
    on_killed = sum(1 for r in lost if killed_at is not None and r.start < killed_at < r.end
                    and r.router in (None, "router-1"))
    p50 = statistics.median(warm) * 1000 if warm else float("nan")
    p90 = warm[int(len(warm) * 0.9)] * 1000 if warm else float("nan")
    print(f"{name:12} conversations {tally.conversations:5} requests {len(tally.requests):5}  "
          f"failed {len(lost):3} (in flight on the killed router "
          f"{on_killed})  turns2+ hit rate {tally.hit_rate:6.1%}  warm TTFT p50 {p50:6.1f} ms p90 {p90:6.1f} ms  "
          f"oracle {oracle:g}", flush=True)
    if lost:
        print(f"{'':12} failures: {dict(Counter(r.why for r in lost).most_common(3))}", flush=True)


def phase(url: str, streams: int, seconds: float, during: Callable[[], None] | None = None) -> Tally:
    with Load(url, streams=streams) as load_:
        worker = threading.Thread(target=during) if during else None
        if worker:
            worker.start()
        time.sleep(seconds)
        if worker:
            worker.join()
        return load_.stop()


PHASES = ("3-routers", "scale-out", "rolling", "router-kill", "routers")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--only", default=",".join(PHASES), help=f"phases after the baseline, of {','.join(PHASES)}")
    args = ap.parse_args()
    wanted = set(args.only.split(","))
    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115
    with tempfile.TemporaryDirectory(prefix="h30b-bench-") as tmp:
        os.environ["PDCTL_HOME"] = f"{tmp}/home"
        ports = [(free_port(), free_port()) for _ in range(4)]
        router, base = free_port(), free_block(3)
        paths = []
        for n in (1, 2):
            paths.append(Path(tmp) / f"topo{n}.yaml")
            paths[-1].write_text(topology(Path(tmp) / "work", ports, n, router, base))
        small, big = load(paths[0]), load(paths[1])
        current: list[Topology] = [small]
        try:
            dep = up(small, quiet)
            key = read_key(LocalTransport(), small, "local") or ""
            lb = dep.router_url
            routers = {s.name: s.url for s in dep.specs if s.role == "router"}

            def engines() -> list[str]:
                state = StateStore(small.name).load()
                return [r.url for r in state.processes.values() if r.role in ("prefill", "decode")] if state else []

            print(f"SIMULATED engines: 1P1D (2P2D after scale-out), 3 routers behind HAProxy; {args.streams} "
                  f"streams x {args.seconds:g} s per phase", flush=True)
            report("one-router", phase(routers["router-0"], args.streams, args.seconds), corrupt_reuses(engines(), key))
            if "3-routers" in wanted:
                report("3-routers", phase(lb, args.streams, args.seconds), corrupt_reuses(engines(), key))
            def grow() -> None:
                up(big, quiet, UpOptions(smoke=False))
                current[0] = big

            if "scale-out" in wanted:
                report("scale-out", phase(lb, args.streams, args.seconds, grow), corrupt_reuses(engines(), key))
            if "rolling" in wanted:
                report("rolling", phase(lb, args.streams, args.seconds, lambda: up(
                    current[0], quiet, UpOptions(restart=True, rolling=True, smoke=False)) and None),
                    corrupt_reuses(engines(), key))

            killed: list[float] = []

            def kill() -> None:
                time.sleep(args.seconds / 3)
                state = StateStore(small.name).load()
                assert state is not None
                killed.append(time.monotonic())
                os.kill(state.processes["router-1"].pid, signal.SIGKILL)
                time.sleep(1.0)
                up(current[0], quiet, UpOptions(smoke=False))

            if "router-kill" in wanted:
                tally = phase(lb, args.streams, args.seconds, kill)
                report("router-kill", tally, corrupt_reuses(engines(), key), killed[0] if killed else None)

            def rescale() -> None:
                src = paths[1] if current[0] is big else paths[0]
                text = src.read_text()
                for n in (2, 3):
                    time.sleep(args.seconds / 3)
                    src.write_text(text.replace("replicas: 3,", f"replicas: {n},"))
                    up(load(src), quiet, UpOptions(smoke=False))

            if "routers" in wanted:
                report("routers", phase(lb, args.streams, args.seconds, rescale), corrupt_reuses(engines(), key))
        finally:
            down(current[0], quiet)


if __name__ == "__main__":
    main()
