"""`pdctl init`: list the shipped topologies, or write one to start from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdctl.cli.support import call, err, out
from pdctl.errors import UsageError
from pdctl.examples import examples, write_example


def init(
    name: Annotated[
        str | None, typer.Option("--example", "-e", help="Shipped topology to write; without it: list them.")
    ] = None,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="File to write (the default is what every command reads).")
    ] = Path("pdctl.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a shipped topology to start from (--example NAME -o FILE); without --example, list them."""
    if name is None:
        if output != Path("pdctl.yaml") or force:
            call(lambda: _needs_example())
        shown = examples()
        width = max(len(e.name) for e in shown)
        for e in shown:
            out.print(f"{e.name:<{width}}  {e.summary}", highlight=False, markup=False)
        err.print("write one with: pdctl init --example NAME [-o FILE]", highlight=False, markup=False)
        return
    chosen = call(lambda: write_example(name, output, force))
    out.print(f"wrote {output} ({chosen.name}: {chosen.summary})", highlight=False, markup=False)
    hint = "" if output == Path("pdctl.yaml") else f" -t {output}"
    out.print(f"next: pdctl validate{hint}", highlight=False, markup=False)


def _needs_example() -> None:
    raise UsageError("-o/--force need --example NAME", hint="`pdctl init` lists the examples")


def register(app: typer.Typer) -> None:
    app.command()(init)
