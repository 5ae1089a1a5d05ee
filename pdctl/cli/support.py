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
from pdctl.state import pdctl_home
from pdctl.topology import Topology, load

T = TypeVar("T")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
DEBUG = {"on": False}

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
        hint="pass -t FILE, set PDCTL_TOPOLOGY, or create ./pdctl.yaml (`pdctl init --example local-sim`)",
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
        log = _write_debug_log(traceback.format_exc())
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        err.print(
            f"[bold red]Internal error:[/] {type(exc).__name__}: {escape(str(exc))} "
            f"({Path(frame.filename).name}:{frame.lineno})",
            highlight=False,
        )
        where = f"full traceback in {log}" if log else "the traceback could not be saved"
        err.print(f"[dim]hint:[/] {escape(where)}; rerun with --debug", highlight=False)
        raise typer.Exit(1) from None


def debug_log_path() -> Path:
    """Where internal errors leave their traceback: the user's pdctl directory, never the current one."""
    return Path(os.environ.get("PDCTL_DEBUG_LOG") or pdctl_home() / "pdctl-debug.log")


def _write_debug_log(text: str) -> Path | None:
    path = debug_log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError:
        return None
    return path


def call(fn: Callable[[], T]) -> T:
    with reported():
        return fn()


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()
