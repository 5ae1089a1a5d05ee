"""`pdctl demo`: the shipped `local-sim` topology brought up on free loopback ports under a unique name, a short
OFF/ON bench in the anchor run's shape (token-id prompts, +512 new tokens per turn), and teardown. Everything it
writes (topology, process logs, report, plots) lies under one directory. Results are simulated.

With `--eviction` it then shows the case where bidirectional transfer matters (issues 29, 41): 2 prefills behind
2 decodes, agent sessions with think times between their turns, at a few numbers of sessions (4 and 16): at the
smaller the prefills' KV holds every session's history, at the larger it holds under half of it, so their prefix
caches evict and recompute. OFF (bidirectional transfer off, prefill caching on: the honest baseline) against ON
as pdctl ships it (its defaults choose each warm turn's source). Each case's report names the path each leg
measured, and its `summary.json` (pdctl.demo_summary) the warm-turn TTFT, path mix and KV read back per point.

`--ports START-END` keeps every process the demo starts (engines, their side channels, the router) in that range.
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
    eviction_sessions: tuple[int, ...] = (4, 16)
    # Blocks of 256 tokens per prefill: 32k tokens, the 4-session point's 2 sessions per prefill with room to spare,
    # under half of the 16-session point's 8.
    eviction_prefill_blocks: int = 128
    ports: tuple[int, int] | None = None  # --ports START-END: every listening port the demo's processes take


# The eviction case's sessions: a shared system prompt, each session's own large task (a repository's files, say),
# tool results between turns and think times. Each session's history grows to ~10k tokens over its 4 turns.
EVICTION_AGENT = AgentSpec(sessions=1, turns=4, system_tokens=2000, task_tokens=6000, tool_tokens=Range(200, 1000),
                           output_tokens=32, think_s=Range(0.5, 3.0), arrival_rate=1.0)
# Warm-turn TTFT only: the inter-token gap is in the report, but on a small shared machine its p99 is mostly the
# host's scheduling noise (times 3 in modelled time at speed 3).
EVICTION_SLO = "ttft_p90=500"
DEMO_PORTS = 9  # the most listening ports one case takes: 2 prefills and 2 decodes with their side channels, the router


def demo_options(out: Path | None, lengths: str, conversations: int, turns: int, speed: float,
                 eviction: bool = False, sessions: str = "4,16", ports: str | None = None) -> DemoOptions:
    """The command line's values checked; `out` None: a new directory under $PDCTL_HOME/demo."""
    if conversations < 1 or turns < 2 or not speed > 0:
        raise UsageError("--conversations must be >= 1, --turns >= 2 and --speed > 0",
                         hint="e.g. pdctl demo --lengths 2000 --turns 2")
    counts = parse_sessions(sessions)
    span = parse_ports(ports) if ports is not None else None
    target = (out or pdctl_home() / "demo" / datetime.now().strftime("%Y%m%d-%H%M%S")).expanduser().resolve()
    return DemoOptions(target, parse_lengths(lengths), conversations, turns, speed=speed, eviction=eviction,
                       eviction_sessions=counts, ports=span)


def parse_sessions(text: str) -> tuple[int, ...]:
    """`4,16`: the eviction case's numbers of concurrent sessions, each >= 1."""
    try:
        counts = tuple(sorted({int(x) for x in text.replace(" ", "").split(",") if x}))
    except ValueError:
        raise UsageError(f"--sessions {text!r} is not a list of integers", hint="e.g. --sessions 4,16") from None
    if not counts or counts[0] < 1:
        raise UsageError(f"--sessions {text!r}: give one or more numbers of sessions, each >= 1",
                         hint="e.g. --sessions 4,16")
    return counts


def parse_ports(text: str) -> tuple[int, int]:
    """`START-END` (inclusive), 1024 <= START, END <= 65535, at least DEMO_PORTS ports."""
    start, sep, end = text.strip().partition("-")
    hint = f"e.g. --ports 22000-22099 (at least {DEMO_PORTS} ports, 1024-65535)"
    if not sep or not start.strip().isdigit() or not end.strip().isdigit():
        raise UsageError(f"--ports {text!r} is not a range START-END", hint=hint)
    lo, hi = int(start), int(end)
    if lo < 1024 or hi > 65535 or lo > hi:
        raise UsageError(f"--ports {text!r}: the range must lie within 1024-65535 with START <= END", hint=hint)
    if hi - lo + 1 < DEMO_PORTS:
        raise UsageError(f"--ports {text!r} holds {hi - lo + 1} ports; the demo needs {DEMO_PORTS}", hint=hint)
    return lo, hi


def free_ports(count: int, span: tuple[int, int] | None = None) -> list[int]:
    """Distinct TCP ports on 127.0.0.1 that nothing listens on, from `span` (inclusive) when given: all held open
    until every one is chosen."""
    held: list[socket.socket] = []
    try:
        candidates = iter(range(span[0], span[1] + 1)) if span else None
        while len(held) < count:
            s = socket.socket()
            try:
                port = 0 if candidates is None else next(candidates)
            except StopIteration:
                s.close()
                assert span is not None
                raise UsageError(f"--ports {span[0]}-{span[1]}: fewer than {count} ports in it are free",
                                 hint="free some, or give a wider range") from None
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def write_topology(opts: DemoOptions) -> Path:
    """local-sim with its own name, ports, speed and work directory, as a file the user can `pdctl down -t`."""
    data: dict[str, Any] = yaml.safe_load(example("local-sim").text)
    prefill, prefill_side, decode, decode_side, router = free_ports(5, opts.ports)
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
    prefill's KV `eviction_prefill_blocks` blocks: fewer than the larger point's sessions' histories."""
    data: dict[str, Any] = yaml.safe_load(example("local-sim").text)
    ports = free_ports(9, opts.ports)
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
    """The eviction case: OFF (prefill caching on) then ON as shipped, each at every number of sessions, on 2P2D.
    The bench deploys each leg itself and takes the deployment down after the last (nothing ran before it)."""
    from pdctl.bench.leg.deploy import LifecycleDeployer
    from pdctl.lifecycle.changes.down import down

    path = write_eviction_topology(opts)
    topo = load(path)
    on_topology(topo, path)
    try:
        bench = BenchOptions(
            topology=path,
            workload=WorkloadSpec(lengths=(16,), conversations=1, turns=2, user_tokens=16, output_tokens=16,
                                  api="completions"),
            legs=parse_legs(["off:connector.bidirectional_kv_xfer=false", "on:connector.bidirectional_kv_xfer=true"]),
            clients=1,
            capacity=CapacityOptions(EVICTION_AGENT, sessions=opts.eviction_sessions, slo=Slo.parse(EVICTION_SLO)),
        )
        result = run_bench(bench, LifecycleDeployer(console), progress)
    except BaseException:
        down(topo, console)  # whatever the bench started before it failed
        raise
    files = report.write(result, opts.out / "eviction")
    return result, files


def run_demo(
    opts: DemoOptions, console: Console, progress: Progress, on_topology: Callable[[Topology, Path], None]
) -> tuple[BenchResult, ReportFiles]:
    """Up (with the smoke test) and down, bench OFF then ON (each leg deployed afresh, down after the last);
    down whatever happened."""
    from pdctl.bench.leg.deploy import LifecycleDeployer
    from pdctl.lifecycle.bringup.pipeline import up
    from pdctl.lifecycle.changes.down import down

    opts.out.mkdir(parents=True, exist_ok=True)
    path = write_topology(opts)
    topo = load(path)
    on_topology(topo, path)
    try:
        up(topo, console)  # and its smoke test: two turns through the router
        # Down again: each leg deploys afresh, and a bench that found the deployment stopped only takes it down
        # after the last leg, instead of bringing it up once more to restore it (seconds of a 2-minute demo).
        down(topo, console)
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
    except BaseException:
        down(topo, console)  # whatever was started before the failure
        raise
    files = report.write(result, opts.out / "bench")
    return result, files
