"""Bring every host of a topology to the state its processes need, changing only what disagrees.

`provision()` is the hook `pdctl up` calls between preflight and launch. It gathers facts on all hosts in
parallel, then runs the operations whose facts disagree with the topology, printing per host what changed (or
"no changes") and the time spent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from pdctl.remote.base import Transport
    from pdctl.topology import Topology


def provision(
    topo: Topology,
    hosts: dict[str, Transport],
    console: Console,
    *,
    allow_reboot: bool = False,
) -> None:
    """Provision `hosts` (host name -> transport) for `topo`; raises a `PdctlError` when a host cannot be.

    Placeholder: changes nothing yet. The real implementation keeps this signature.
    """
    del topo, hosts, allow_reboot
    console.print("provision: nothing to do yet")
