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
