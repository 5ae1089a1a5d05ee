"""What `pdctl plan` shows: every process `up` would start and, for a Slurm topology, the job and steps that
would run them. Pure: reads no host and submits nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdctl.plan import ProcessSpec, plan
from pdctl.topology import Topology


@dataclass
class Planned:
    specs: list[ProcessSpec]
    slurm_lines: list[str] = field(default_factory=list)  # the holder job, then one srun step per process


def planned(topo: Topology) -> Planned:
    """The plan of `topo`; a Slurm topology is planned on the hosts its job would get (shown by name)."""
    if topo.slurm is None:
        return Planned(plan(topo))
    from pdctl.slurm.commands import plan_lines, planned_topology

    topo = planned_topology(topo)
    specs = plan(topo)
    return Planned(specs, plan_lines(topo, [(s.name, s.node) for s in specs]))
