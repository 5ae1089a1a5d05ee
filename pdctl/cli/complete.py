"""Values that tab completion offers (typer's `autocompletion` hooks): shipped example names, the process names
of the topology on the command line, and the fixed choices of a few options. A completion never fails: a
topology that does not load offers nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

Candidates = list[tuple[str, str]]


def example_names(incomplete: str) -> Candidates:
    """`pdctl init --example <TAB>`: the shipped topologies, each with its summary."""
    from pdctl.examples import examples

    return [(e.name, e.summary) for e in examples() if e.name.startswith(incomplete)]


def process_names(ctx: typer.Context, incomplete: str) -> Candidates:
    """`pdctl logs <TAB>`: the processes of the topology given with -t (or the default one), in start order."""
    from pdctl.cli.support import topology_path
    from pdctl.plan import plan
    from pdctl.topology import load

    given = ctx.params.get("topology")
    try:
        topo = load(topology_path(Path(given) if given else None), ctx.params.get("overrides") or None)
        specs = plan(topo)
    except Exception:  # a half-typed line: no candidates rather than a traceback in the user's shell
        return []
    return [(s.name, f"{s.role} on {s.node}") for s in specs if s.name.startswith(incomplete)]


def choices(*values: str) -> Callable[[str], list[str]]:
    """A completion of fixed values (an option that takes one of a few words)."""

    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return complete
