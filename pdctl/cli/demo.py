"""`pdctl demo`: simulated up -> short OFF/ON bench -> down, from nothing but the installed package."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pdctl.bench.estimate import estimate
from pdctl.bench.progress import make_progress
from pdctl.bench.render import print_outcome
from pdctl.bench.workload import WorkloadSpec
from pdctl.cli.bench import parse_lengths
from pdctl.cli.support import call, err, out
from pdctl.demo import DemoOptions, run_demo
from pdctl.errors import UsageError
from pdctl.state import pdctl_home
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

    def options() -> DemoOptions:
        if conversations < 1 or turns < 2 or not speed > 0:
            raise UsageError("--conversations must be >= 1, --turns >= 2 and --speed > 0",
                             hint="e.g. pdctl demo --lengths 2000 --turns 2")
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        target = (out_dir or pdctl_home() / "demo" / stamp).expanduser().resolve()
        return DemoOptions(target, parse_lengths(lengths), conversations, turns, speed=speed)

    opts = call(options)

    def announce(topo: Topology, path: Path) -> None:
        err.print(f"pdctl demo: simulated engines (pdctl.sim), deployment {topo.name}; output in {opts.out}",
                  highlight=False, markup=False)
        err.print(f"if it is interrupted, clean up with: pdctl down -t {path}", highlight=False, markup=False)
        spec = WorkloadSpec(opts.lengths, opts.conversations, opts.turns, opts.user_tokens, opts.output_tokens)
        guess = estimate(spec, legs=2, clients=1, engine="sim", speed=opts.speed, redeploy=True)
        err.print(guess.line(simulated=True), highlight=False, markup=False)

    with make_progress(console, opts.turns) as progress:
        result, files = call(lambda: run_demo(opts, console, progress, announce))
    print_outcome(result, files, out)
    out.print(f"demo finished in {time.monotonic() - start:.0f} s (results are simulated); output: {opts.out}",
              highlight=False, markup=False)
    if not result.passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(demo)
