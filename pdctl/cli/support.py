"""Which topology a command means: -t FILE, else $PDCTL_TOPOLOGY, else ./pdctl.yaml."""

from __future__ import annotations

import os
from pathlib import Path

from pdctl.cli.errors import call
from pdctl.cli.output import err, out, say
from pdctl.errors import UsageError
from pdctl.topology import Topology, load
from pdctl.topology.notes import notes, warnings

__all__ = ["call", "err", "load_topology", "out", "topology_path"]  # call, err, out: cli/router.py's imports


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


def load_topology(given: Path | None, overrides: list[str] | None = None, *, noted: bool = False) -> Topology:
    """The topology a command means; `noted`: say on stderr what it holds that pdctl will not use (the commands
    that check or start a deployment say it; the others would repeat it at every call)."""
    topo = load(topology_path(given), overrides)
    if noted:
        for line in notes(topo):
            say(err, f"note: {line}")
        for line in warnings(topo):
            say(err, f"warning: {line}")
    return topo
