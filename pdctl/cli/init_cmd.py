"""`pdctl init`: list the shipped topologies, or write one to start from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdctl.cli.complete import example_names
from pdctl.cli.output import err, out, say
from pdctl.errors import UsageError
from pdctl.examples import examples, write_example


def init(
    name: Annotated[
        str | None, typer.Option("--example", "-e", help="Shipped topology to write; without it: list them.",
                                  autocompletion=example_names)
    ] = None,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="File to write (the default is what every command reads).")
    ] = Path("pdctl.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a shipped topology to start from (--example NAME -o FILE); without --example, list them."""
    if name is None:
        if output != Path("pdctl.yaml") or force:
            raise UsageError("-o/--force need --example NAME", hint="`pdctl init` lists the examples")
        shown = examples()
        width = max(len(e.name) for e in shown)
        for e in shown:
            say(out, f"{e.name:<{width}}  {e.summary}")
        say(err, "write one with: pdctl init --example NAME [-o FILE]")
        return
    chosen = write_example(name, output, force)
    say(out, f"wrote {output} ({chosen.name}: {chosen.summary})")
    hint = "" if output == Path("pdctl.yaml") else f" -t {output}"
    say(out, f"next: pdctl validate{hint}")


def register(app: typer.Typer) -> None:
    app.command()(init)
