"""The CLI's one error boundary; every command runs inside it (`root.RootGroup.invoke`).

    PdctlError          `Error: <message>` and `hint: <hint>` on stderr, exit 2 (bad input) or 1 (runtime);
                        with --debug the traceback first
    KeyboardInterrupt   `interrupted`, exit 130
    BrokenPipeError     the reader of stdout left (`pdctl plan | head`): passed to click, which exits 1 quietly
    anything else       `Internal error: <type>: <message> (<file>:<line>)` and where the traceback was saved,
                        exit 1; the traceback goes to the debug log, and to stderr only with --debug
typer's own exits and usage errors pass through: typer prints those itself.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import typer
from rich.markup import escape
from typer.exceptions import TyperException

from pdctl.cli.output import err
from pdctl.errors import PdctlError
from pdctl.state import pdctl_home

T = TypeVar("T")

DEBUG = {"on": False}
INTERRUPTED_EXIT = 130


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
        raise typer.Exit(INTERRUPTED_EXIT) from None
    except BrokenPipeError:
        raise
    except (typer.Exit, typer.Abort, TyperException, SystemExit):
        raise
    except Exception as exc:
        text = traceback.format_exc()
        log = _write_debug_log(text)
        if DEBUG["on"]:
            sys.stderr.write(text)
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        err.print(
            f"[bold red]Internal error:[/] {type(exc).__name__}: {escape(str(exc))} "
            f"({Path(frame.filename).name}:{frame.lineno})",
            highlight=False,
        )
        where = f"full traceback in {log}" if log else "the traceback could not be saved"
        err.print(f"[dim]hint:[/] {escape(where)}; rerun with --debug", highlight=False)
        raise typer.Exit(1) from None


def call(fn: Callable[[], T]) -> T:
    """`fn()` inside the boundary, for code that runs outside a command (a command is inside it already)."""
    with reported():
        return fn()


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
