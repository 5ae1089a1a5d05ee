"""`pdctl demo`: the shipped `local-sim` topology brought up on free loopback ports under a unique name, a short
OFF/ON bench in the anchor run's shape (token-id prompts, +512 new tokens per turn), and teardown. Everything it
writes (topology, process logs, report, plots) lies under one directory. Results are simulated.

With `--eviction` it then shows the case where bidirectional transfer matters (issue 29), beside the single-client
one: 2 prefills behind 2 decodes, each prefill's KV smaller than the agent sessions' histories (its prefix cache
evicts them), agent-shaped turns with think times; OFF with prefill caching on (the honest baseline) against ON
through the prefill (every warm turn reads from its decode what the prefill's cache lacks).
Each case's report names the path each leg measured.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from pdctl.bench.leg.legs import parse_legs
from pdctl.bench.output import report
from pdctl.bench.output.report import ReportFiles
from pdctl.bench.results.records import BenchResult
from pdctl.bench.runner.capacity import CapacityOptions, Slo
from pdctl.bench.runner.capacity import table as capacity_table
from pdctl.bench.runner.options import parse_lengths
from pdctl.bench.runner.run import BenchOptions, Progress, run_bench
from pdctl.bench.traffic.agent import AgentSpec, Range
from pdctl.bench.traffic.workload import WorkloadSpec
from pdctl.errors import UsageError
from pdctl.examples import example
from pdctl.state import pdctl_home
from pdctl.topology import Topology, load


@dataclass(frozen=True)
class DemoOptions:
    out: Path
    lengths: tuple[int, ...] = (2000, 8000, 16000, 24000)
    conversations: int = 2
    turns: int = 3
    user_tokens: int = 512
    output_tokens: int = 32
    # Speed 3 (not the file's 10) keeps the simulated prefill compute well above a small machine's own Python
    # overhead, so the curve keeps its H200 shape.
    speed: float = 3.0
    eviction: bool = False
    eviction_sessions: int = 8
    eviction_prefill_blocks: int = 160  # of 256 tokens: 41k tokens per prefill, fewer than 8 sessions' histories


def demo_options(out: Path | None, lengths: str, conversations: int, turns: int, speed: float,
                 eviction: bool = False, sessions: int = 8) -> DemoOptions:
    """The command line's values checked; `out` None: a new directory under $PDCTL_HOME/demo."""
    if conversations < 1 or turns < 2 or not speed > 0 or sessions < 1:
        raise UsageError("--conversations must be >= 1, --turns >= 2, --speed > 0 and --sessions >= 1",
                         hint="e.g. pdctl demo --lengths 2000 --turns 2")
    target = (out or pdctl_home() / "demo" / datetime.now().strftime("%Y%m%d-%H%M%S")).expanduser().resolve()
    return DemoOptions(target, parse_lengths(lengths), conversations, turns, speed=speed, eviction=eviction,
                       eviction_sessions=sessions)


def free_ports(count: int) -> list[int]:
    """Distinct TCP ports on 127.0.0.1 that nothing listens on: all held open until every one is chosen."""
    held = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def write_topology(opts: DemoOptions) -> Path:
    """local-sim with its own name, ports, speed and work directory, as a file the user can `pdctl down -t`."""
    data: dict[str, Any] = yaml.safe_load(example("local-sim").text)
    prefill, prefill_side, decode, decode_side, router = free_ports(5)
    data["name"] = f"demo-{secrets.token_hex(3)}"
    data["prefill"][0].update(port=prefill, side_channel_port=prefill_side)
    data["decode"][0].update(port=decode, side_channel_port=decode_side)
    data["router"]["port"] = router
    data["sim"]["speed"] = opts.speed
    data["work_dir"] = str(opts.out / "run")
    path = opts.out / "topology.yaml"
    header = "# Written by `pdctl demo`: configs/local-sim.yaml on free ports. Results from it are simulated.\n"
    path.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def write_eviction_topology(opts: DemoOptions) -> Path:
    """local-sim as 2P2D on free ports, the engines on the step model at block 256 (pdctl's GPU defaults), each
    prefill's KV `eviction_prefill_blocks` blocks: fewer than the sessions' histories."""
    data: dict[str, Any] = yaml.safe_load(example("local-sim").text)
    ports = free_ports(9)
    data["name"] = f"demo-{secrets.token_hex(3)}-eviction"
    data["prefill"] = [{"node": "local", "port": ports[i], "side_channel_port": ports[i + 1]} for i in (0, 2)]
    data["decode"] = [{"node": "local", "port": ports[i], "side_channel_port": ports[i + 1]} for i in (4, 6)]
    data["router"]["port"] = ports[8]
    data["model"] = {**data["model"], "block_size": 256}
    data["sim"] = {"speed": opts.speed, "num_blocks": 896, "args": ["--step-model", "h200-graphs"]}  # an H200's KV
    data["extra_args"] = {"prefill": ["--num-gpu-blocks", str(opts.eviction_prefill_blocks)]}
    data["work_dir"] = str(opts.out / "eviction-run")
    path = opts.out / "eviction-topology.yaml"
    header = ("# Written by `pdctl demo --eviction`: configs/local-sim.yaml as 2P2D on free ports, prefills whose KV "
              "cannot hold the sessions. Results from it are simulated.\n")
    path.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def run_eviction(opts: DemoOptions, console: Console, progress: Progress,
                 on_topology: Callable[[Topology, Path], None]) -> tuple[BenchResult, ReportFiles]:
    """The eviction case: N agent sessions, OFF (prefill caching on) then ON, on 2P2D; down whatever happened."""
    from pdctl.bench.leg.deploy import LifecycleDeployer
    from pdctl.lifecycle.bringup.pipeline import up
    from pdctl.lifecycle.changes.down import down

    path = write_eviction_topology(opts)
    topo = load(path)
    on_topology(topo, path)
    agent = AgentSpec(sessions=1, turns=4, system_tokens=6000, tool_tokens=Range(200, 2000), output_tokens=200,
                      think_s=Range(2.0, 8.0), arrival_rate=2.0)
    try:
        up(topo, console)
        bench = BenchOptions(
            topology=path,
            workload=WorkloadSpec(lengths=(16,), conversations=1, turns=2, user_tokens=16, output_tokens=16,
                                  api="completions"),
            # ON through the prefill (local_prefill_tokens 0): the default would run most warm turns on their
            # decode alone, which is conditional disaggregation, not the transfer this case shows.
            legs=parse_legs(["off-cached:connector.bidirectional_kv_xfer=false",
                             "on-prefill:connector.bidirectional_kv_xfer=true,router.local_prefill_tokens=0"]),
            clients=1,
            capacity=CapacityOptions(agent, sessions=(opts.eviction_sessions,),
                                     slo=Slo.parse("ttft_p90=500,itl_p99=200")),
        )
        result = run_bench(bench, LifecycleDeployer(console), progress)
        files = report.write(result, opts.out / "eviction")
    finally:
        down(topo, console)
    return result, files


def capacity_lines(result: BenchResult) -> list[str]:
    """The eviction case's points as the capacity table prints them (warm TTFT p50/p90, ITL p99, within the SLO)."""
    points, slo = report.capacity_points(result)
    return capacity_table(points, slo)


def run_demo(
    opts: DemoOptions, console: Console, progress: Progress, on_topology: Callable[[Topology, Path], None]
) -> tuple[BenchResult, ReportFiles]:
    """Up (with the smoke test), bench OFF then ON, down: down runs whatever happened before it."""
    from pdctl.bench.leg.deploy import LifecycleDeployer
    from pdctl.lifecycle.bringup.pipeline import up
    from pdctl.lifecycle.changes.down import down

    opts.out.mkdir(parents=True, exist_ok=True)
    path = write_topology(opts)
    topo = load(path)
    on_topology(topo, path)
    try:
        up(topo, console)
        bench = BenchOptions(
            topology=path,
            workload=WorkloadSpec(
                lengths=opts.lengths, conversations=opts.conversations, turns=opts.turns,
                user_tokens=opts.user_tokens, output_tokens=opts.output_tokens, api="completions",
            ),
            legs=parse_legs(None),
            clients=1,
        )
        result = run_bench(bench, LifecycleDeployer(console), progress)
        files = report.write(result, opts.out / "bench")
    finally:
        down(topo, console)
    return result, files
