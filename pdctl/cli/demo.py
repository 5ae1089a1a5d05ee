"""`pdctl demo`: simulated up -> short OFF/ON bench -> down, from nothing but the installed package."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from pdctl import demo_summary
from pdctl.bench.output.progress import make_progress
from pdctl.bench.output.render import print_outcome
from pdctl.bench.output.report import ReportFiles
from pdctl.bench.results.paths import leg_path
from pdctl.bench.results.records import BenchResult
from pdctl.bench.runner.estimate import estimate
from pdctl.bench.traffic.workload import WorkloadSpec
from pdctl.cli.errors import INTERRUPTED_EXIT
from pdctl.cli.output import err, out, pdctl_command, say
from pdctl.demo import EVICTION_AGENT, DemoOptions, demo_options, run_demo, run_eviction
from pdctl.topology import Topology

DEFAULTS = DemoOptions(Path())


def demo(
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Output directory; default $PDCTL_HOME/demo/TIME (~/.pdctl).")
    ] = None,
    lengths: Annotated[str, typer.Option(help="Tokens of history at turn 1, comma-separated.")] = ",".join(
        map(str, DEFAULTS.lengths)
    ),
    conversations: Annotated[int, typer.Option(help="Conversations per length.")] = DEFAULTS.conversations,
    turns: Annotated[int, typer.Option(help="Turns per conversation.")] = DEFAULTS.turns,
    speed: Annotated[float, typer.Option(help="Simulator speed (x the H200 it is calibrated on).")] = DEFAULTS.speed,
    eviction: Annotated[bool, typer.Option(
        "--eviction", help="Then the case where bidirectional transfer matters: agent sessions on 2P2D, more of "
        "them than the prefills' KV holds at the larger count, OFF (prefill caching on) against ON (about a "
        "minute more).")] = False,
    sessions: Annotated[str, typer.Option(help="--eviction: numbers of concurrent agent sessions, comma-separated.")
                        ] = ",".join(map(str, DEFAULTS.eviction_sessions)),
    ports: Annotated[str | None, typer.Option(
        "--ports", metavar="START-END", help="Take every port the demo's processes listen on from this range "
        "(e.g. 22000-22099); default: any free ports.")] = None,
) -> None:
    """Bring up simulated prefill/decode engines and the router on free ports, bench OFF vs ON, tear down.

    Needs no GPU, no checkout and no topology file; results are simulated. Ctrl-C stops it, takes down what it
    started and exits 130.
    """
    start = time.monotonic()
    console = Console(stderr=True, soft_wrap=True)
    opts = demo_options(out_dir, lengths, conversations, turns, speed, eviction, sessions, ports)
    try:
        _run(opts, console)
    except KeyboardInterrupt:
        _interrupted(opts, start)
    say(out, f"demo finished in {time.monotonic() - start:.0f} s (results are simulated); output: {opts.out}")


def _run(opts: DemoOptions, console: Console) -> None:
    start = time.monotonic()

    def announce(topo: Topology, path: Path) -> None:
        say(err, f"pdctl demo: simulated engines (pdctl.sim), deployment {topo.name}; output in {opts.out}")
        say(err, f"if it is interrupted, clean up with: {pdctl_command()} down -t {path}")
        spec = WorkloadSpec(opts.lengths, opts.conversations, opts.turns, opts.user_tokens, opts.output_tokens)
        guess = estimate(spec, legs=2, clients=1, engine="sim", speed=opts.speed, redeploy=True)
        say(err, guess.line(simulated=True))

    with make_progress(console, opts.turns) as progress:
        result, files = run_demo(opts, console, progress, announce)
    if result.interrupted:
        raise KeyboardInterrupt
    say(out, "Case 1 (simulated): one client, one prefill, one decode; the prefill's cache holds each conversation")
    print_outcome(result, files, out)
    first = demo_summary.sweep_summary(result, "single client")
    say(out, f"summary: {demo_summary.write(first, files.out)}")
    passed = result.passed
    if opts.eviction:
        def announce_eviction(topo: Topology, path: Path) -> None:
            say(err, f"pdctl demo: eviction case, deployment {topo.name}; clean up with: "
                     f"{pdctl_command()} down -t {path}")
            say(err, f"eviction case: OFF then ON, {' and '.join(map(str, opts.eviction_sessions))} agent sessions "
                     "each; about a minute on 2 cores (simulated engines)")

        with make_progress(console, 4) as progress:
            evicted, evicted_files = run_eviction(opts, console, progress, announce_eviction)
        if evicted.interrupted:
            raise KeyboardInterrupt
        print_eviction(opts, evicted, evicted_files)
        passed = passed and evicted.passed
    if not passed:
        say(out, f"demo FAILED in {time.monotonic() - start:.0f} s (results are simulated); output: {opts.out}")
        raise typer.Exit(1)


def print_eviction(opts: DemoOptions, result: BenchResult, files: ReportFiles) -> None:
    """Case 2 in the same style as case 1: one rich table per point and leg, the ratio, where the files are."""
    a, most = EVICTION_AGENT, max(opts.eviction_sessions)
    history = a.system_tokens + a.task_tokens + (a.turns - 1) * (a.output_tokens + a.tool_tokens.mean)
    counts = " and ".join(map(str, opts.eviction_sessions))
    kv = opts.eviction_prefill_blocks * 256
    fate = "its prefix cache evicts them" if most / 2 * history > kv else "its prefix cache can hold them"
    say(out, f"\nCase 2 (simulated): {counts} agent sessions on 2 prefills + 2 decodes. Each prefill's KV holds "
             f"{kv} tokens; a session's history grows to ~{history / 1000:.0f}k, so at {most} sessions "
             f"(~{most / 2:g} per prefill) {fate}")
    summary = demo_summary.capacity_summary(result, "eviction")
    demo_summary.print_case(summary, f"Warm turns (turn 2+), {summary.time}; SLO {summary.slo.describe()}"
                            if summary.slo else "Warm turns (turn 2+)", out)
    for leg in result.legs:
        path = leg_path(leg)
        say(out, f"leg {path.label}")
        if path.flag:
            out.print(f"[bold yellow]flag:[/] {escape(path.flag)}", highlight=False)
        if leg.passed:
            out.print(f"[green]leg {leg.name}: passed[/]", highlight=False)
        for failure in leg.failures:
            out.print(f"[bold red]leg {leg.name} FAILED:[/] {failure}", highlight=False)
    say(out, f"report: {files.report}")
    say(out, f"plots:  {files.out / 'goodput.png'}")
    say(out, f"        {files.ttft_png}")
    say(out, f"summary: {demo_summary.write(summary, files.out)}")


def _interrupted(opts: DemoOptions, start: float) -> None:
    say(err, f"demo interrupted after {time.monotonic() - start:.0f} s; what it started is down; partial "
             f"output in {opts.out}")
    raise typer.Exit(INTERRUPTED_EXIT)


def register(app: typer.Typer) -> None:
    app.command()(demo)
