"""`pdctl demo`: simulated up -> short OFF/ON bench -> down, from nothing but the installed package."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pdctl.bench.estimate import estimate
from pdctl.bench.progress import make_progress
from pdctl.bench.render import print_outcome
from pdctl.bench.workload import WorkloadSpec
from pdctl.cli.output import err, out, pdctl_command, say
from pdctl.demo import DemoOptions, demo_options, run_demo
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
) -> None:
    """Bring up simulated prefill/decode engines and the router on free ports, bench OFF vs ON, tear down.

    Needs no GPU, no checkout and no topology file; results are simulated.
    """
    start = time.monotonic()
    console = Console(stderr=True, soft_wrap=True)

    opts = demo_options(out_dir, lengths, conversations, turns, speed)

    def announce(topo: Topology, path: Path) -> None:
        say(err, f"pdctl demo: simulated engines (pdctl.sim), deployment {topo.name}; output in {opts.out}")
        say(err, f"if it is interrupted, clean up with: {pdctl_command()} down -t {path}")
        spec = WorkloadSpec(opts.lengths, opts.conversations, opts.turns, opts.user_tokens, opts.output_tokens)
        guess = estimate(spec, legs=2, clients=1, engine="sim", speed=opts.speed, redeploy=True)
        say(err, guess.line(simulated=True))

    with make_progress(console, opts.turns) as progress:
        result, files = run_demo(opts, console, progress, announce)
    print_outcome(result, files, out)
    say(out, f"demo finished in {time.monotonic() - start:.0f} s (results are simulated); output: {opts.out}")
    if not result.passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(demo)
