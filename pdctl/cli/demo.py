"""`pdctl demo`: simulated up -> short OFF/ON bench -> down, from nothing but the installed package."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pdctl.bench.output.progress import make_progress
from pdctl.bench.output.render import print_outcome
from pdctl.bench.runner.estimate import estimate
from pdctl.bench.traffic.workload import WorkloadSpec
from pdctl.cli.output import err, out, pdctl_command, say
from pdctl.demo import DemoOptions, capacity_lines, demo_options, run_demo, run_eviction
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
        "--eviction", help="Then the case where bidirectional transfer matters: agent sessions on 2P2D whose "
        "prefills' KV cannot hold them, OFF (prefill caching on) against ON (a few minutes more).")] = False,
    sessions: Annotated[int, typer.Option(help="--eviction: concurrent agent sessions.")] = DEFAULTS.eviction_sessions,
) -> None:
    """Bring up simulated prefill/decode engines and the router on free ports, bench OFF vs ON, tear down.

    Needs no GPU, no checkout and no topology file; results are simulated.
    """
    start = time.monotonic()
    console = Console(stderr=True, soft_wrap=True)

    opts = demo_options(out_dir, lengths, conversations, turns, speed, eviction, sessions)

    def announce(topo: Topology, path: Path) -> None:
        say(err, f"pdctl demo: simulated engines (pdctl.sim), deployment {topo.name}; output in {opts.out}")
        say(err, f"if it is interrupted, clean up with: {pdctl_command()} down -t {path}")
        spec = WorkloadSpec(opts.lengths, opts.conversations, opts.turns, opts.user_tokens, opts.output_tokens)
        guess = estimate(spec, legs=2, clients=1, engine="sim", speed=opts.speed, redeploy=True)
        say(err, guess.line(simulated=True))

    with make_progress(console, opts.turns) as progress:
        result, files = run_demo(opts, console, progress, announce)
    say(out, "Case 1 (simulated): one client, one prefill, one decode; the prefill's cache holds each conversation")
    print_outcome(result, files, out)
    passed = result.passed
    if opts.eviction:
        def announce_eviction(topo: Topology, path: Path) -> None:
            say(err, f"pdctl demo: eviction case, deployment {topo.name}; clean up with: pdctl down -t {path}")

        with make_progress(console, 4) as progress:
            evicted, evicted_files = run_eviction(opts, console, progress, announce_eviction)
        say(out, f"\nCase 2 (simulated): {opts.eviction_sessions} agent sessions on 2 prefills + 2 decodes, each "
                 f"prefill's KV {opts.eviction_prefill_blocks * 256} tokens (fewer than the sessions' histories)")
        print_outcome(evicted, evicted_files, out)
        for line in capacity_lines(evicted):
            say(out, line)
        passed = passed and evicted.passed
    say(out, f"demo finished in {time.monotonic() - start:.0f} s (results are simulated); output: {opts.out}")
    if not passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(demo)
