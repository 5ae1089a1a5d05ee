"""The `pdctl` app: the root group (every command runs inside the error boundary), `validate` and `plan`, and
the registration of each command group's module."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from pdctl import __version__
from pdctl.cli.errors import DEBUG, reported
from pdctl.cli.help_examples import epilog
from pdctl.cli.options import DebugOpt, JsonOpt, SetOpt, TopologyOpt
from pdctl.cli.output import err, out, say
from pdctl.cli.support import load_topology
from pdctl.examples import own_host_fields
from pdctl.lifecycle.bringup.planned import planned
from pdctl.plan_view import plan_json, render_plan


class RootGroup(TyperGroup):
    """`--debug` works anywhere on the line: it is moved in front of the subcommand, where the callback reads it.
    Every subcommand, nested groups included, is invoked inside the one error boundary."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        cut = argv.index("--") if "--" in argv else len(argv)
        if "--debug" in argv[:cut]:
            argv = ["--debug", *(x for x in argv[:cut] if x != "--debug"), *argv[cut:]]
        return super().main(argv, prog_name, complete_var, standalone_mode, windows_expand_args, **extra)

    def invoke(self, ctx: Any) -> Any:
        with reported():
            return super().invoke(ctx)


EXAMPLES = epilog([
    ("pdctl demo", "simulated 1P1D on free ports: up, OFF/ON bench, down"),
    ("pdctl init --example local-sim", "write ./pdctl.yaml, read by default"),
    ("pdctl validate && pdctl up", "check the file, then start it"),
    ("pdctl status", "health, KV use, router hit rate"),
    ("pdctl bench --lengths 2000,8000", "OFF vs ON legs, report and plots"),
    ("pdctl down", ""),
    ("pdctl --install-completion", "tab completion (bash, zsh, fish)"),
])

app = typer.Typer(
    cls=RootGroup,
    help="Run prefill/decode disaggregated vLLM with bidirectional KV transfer, from one YAML topology.",
    epilog=EXAMPLES,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _version(asked: bool) -> None:
    if asked:
        out.print(__version__)
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: DebugOpt = False,
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_version)
    ] = False,
) -> None:
    DEBUG["on"] = debug


@app.command()
def validate(topology: TopologyOpt = None, overrides: SetOpt = None) -> None:
    """Check a topology file and report every problem with its file:line."""
    topo = load_topology(topology, overrides, noted=True)
    out.print(
        f"[green]ok[/] {topo.name}: {len(topo.prefill)} prefill, {len(topo.decode)} decode, "
        f"engine {topo.engine}, {len(topo.nodes)} node(s)"
    )
    own = own_host_fields(topo.name, topo)
    if own:
        say(err, f"note: {topo.name} is written for pdctl's own GPU host (docs/gpu-run.md); for yours set "
                 f"{', '.join(own)} (docs/cluster-guide.md)")


@app.command()
def plan(topology: TopologyOpt = None, overrides: SetOpt = None, as_json: JsonOpt = False) -> None:
    """Print every process `up` would start: host, argv, environment, log, health URL, ports."""
    shown = planned(load_topology(topology, overrides, noted=True))
    if as_json:
        print(plan_json(shown.specs))
        return
    if shown.slurm_lines:
        out.print("[bold]slurm[/]: the holder job, then one step per process", highlight=False)
        for line in shown.slurm_lines:
            say(out, line)
    render_plan(shown.specs, out)


# Each area registers its commands from its own module (one line each, keep alphabetical).
# e.g.: from pdctl.cli.router import register as _register_router; _register_router(app)
from pdctl.cli.bench import register as _register_bench; _register_bench(app)  # noqa: E402, E702, I001
from pdctl.cli.demo import register as _register_demo; _register_demo(app)  # noqa: E402, E702, I001
from pdctl.cli.doctor import register as _register_doctor; _register_doctor(app)  # noqa: E402, E702, I001
from pdctl.cli.init_cmd import register as _register_init; _register_init(app)  # noqa: E402, E702, I001
from pdctl.cli.lifecycle import register as _register_lifecycle; _register_lifecycle(app)  # noqa: E402, E702, I001
from pdctl.cli.observe import register as _register_observe; _register_observe(app)  # noqa: E402, E702, I001
from pdctl.cli.router import register as _register_router; _register_router(app)  # noqa: E402, E702, I001
from pdctl.cli.tokenizer import register as _register_tokenizer; _register_tokenizer(app)  # noqa: E402, E702, I001
# Last: each registered command gets the examples at the foot of its --help.
from pdctl.cli.help_examples import add_examples; add_examples(app)  # noqa: E402, E702, I001


def main() -> None:
    """The `pdctl` console script. After a Ctrl-C the process ends at once (`os._exit`, stdio flushed) instead of
    through the interpreter's shutdown: a KeyboardInterrupt that lands while a worker thread is being joined can
    leave that thread unjoinable on CPython < 3.12, and the shutdown would then wait for it forever. What pdctl
    must keep is written before that point (the state file as processes start; the lock goes with the process)."""
    interrupted = threading.Event()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        interrupted.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        app()
        code: str | int | None = 0
    except SystemExit as exc:
        code = exc.code
    if interrupted.is_set():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 0 if code is None else 1)
    sys.exit(code)
