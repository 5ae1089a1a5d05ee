"""The topology: one YAML document describing a P/D deployment.

    model          the pydantic schema (every field's description and default); imports neither of the others
    file           reading a file into a frozen Topology, every problem at file:line
    checks         the cross-field rules a schema cannot express
    strings        the constrained string types (every value that can reach a shell on a host)
    bounded_yaml   YAML read within bounds (size, depth, aliases), with each key's line
"""

from __future__ import annotations

from pathlib import Path

from pdctl.topology.file import load_file, parse
from pdctl.topology.model import SHARED_GPU_UCX_ENV, Instance, Node, Role, Topology

__all__ = ["SHARED_GPU_UCX_ENV", "Instance", "Node", "Role", "Topology", "load", "parse"]


def load(path: str | Path, overrides: list[str] | None = None) -> Topology:
    """Read, validate and freeze a topology file; `overrides` are `dotted.key=yaml-value` strings."""
    return load_file(Path(path), overrides or [])
