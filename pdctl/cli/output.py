"""Where commands write: data to stdout (`out`), progress and errors to stderr (`err`), both without colour codes
when not on a terminal (rich decides)."""

from __future__ import annotations

import json

from rich.console import Console

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def print_json(data: object, indent: int = 2) -> None:
    """A command's `--json` result: plain JSON on stdout, never through rich (no wrapping, no markup)."""
    print(json.dumps(data, indent=indent), flush=True)


def say(console: Console, text: str) -> None:
    """One line of plain text: no markup, no highlighting (names and paths stay as they are)."""
    console.print(text, highlight=False, markup=False)


def pdctl_command() -> str:
    """How the user runs this pdctl from their shell: `pdctl` when that is it on PATH, else its full path (a
    checkout's `.venv/bin/pdctl` after scripts/demo, which activates nothing), else `python -m pdctl`.
    `$PDCTL_USER_PATH`: the user's PATH where a script changed it (scripts/demo)."""
    import os
    import shutil
    import sys
    from pathlib import Path

    mine = Path(sys.executable).parent / "pdctl"
    found = shutil.which("pdctl", path=os.environ.get("PDCTL_USER_PATH") or os.environ.get("PATH"))
    if found is not None and mine.exists() and Path(found).resolve() == mine.resolve():
        return "pdctl"
    if mine.exists():
        return str(mine)
    return f"{sys.executable} -m pdctl"
