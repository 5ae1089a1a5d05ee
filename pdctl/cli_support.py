"""What every CLI command shares: topology resolution, error reporting, consoles."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from pdctl.errors import PdctlError, UsageError
from pdctl.topology import Topology, load

T = TypeVar("T")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
DEBUG = {"on": False}
DEBUG_LOG = Path(os.environ.get("PDCTL_DEBUG_LOG", "pdctl-debug.log"))

TOPOLOGY_HELP = "Topology file; default $PDCTL_TOPOLOGY, then ./pdctl.yaml."


def topology_path(given: Path | None) -> Path:
    if given is not None:
        return given
    env = os.environ.get("PDCTL_TOPOLOGY")
    if env:
        return Path(env)
    default = Path("pdctl.yaml")
    if default.exists():
        return default
    raise UsageError(
        "no topology given",
        hint="pass -t FILE, set PDCTL_TOPOLOGY, or create ./pdctl.yaml (see configs/local-sim.yaml)",
    )


def load_topology(given: Path | None, overrides: list[str] | None = None) -> Topology:
    return load(topology_path(given), overrides)


@contextmanager
def reported() -> Iterator[None]:
    """Turn pdctl errors into one message and an exit code; unexpected ones into a short line and a log."""
    try:
        yield
    except PdctlError as exc:
        if DEBUG["on"]:
            traceback.print_exc()
        err.print(f"[bold red]Error:[/] {escape(exc.message)}", highlight=False)
        if exc.hint:
            err.print(f"[dim]hint:[/] {escape(exc.hint)}", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except Exception as exc:
        if DEBUG["on"]:
            raise
        DEBUG_LOG.write_text(traceback.format_exc())
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        err.print(
            f"[bold red]Internal error:[/] {type(exc).__name__}: {escape(str(exc))} "
            f"({Path(frame.filename).name}:{frame.lineno})",
            highlight=False,
        )
        err.print(f"[dim]hint:[/] full traceback in {DEBUG_LOG}; rerun with --debug", highlight=False)
        raise typer.Exit(1) from None


def call(fn: Callable[[], T]) -> T:
    with reported():
        return fn()


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()
