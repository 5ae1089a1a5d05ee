"""The bench's way to (re)deploy a leg: the lifecycle library's `up` with a restart, and its `down`."""

from __future__ import annotations

from rich.console import Console

from pdctl.topology import Topology


class LifecycleDeployer:
    """Every leg starts from scratch (router state included), as the seed's manual recipe did by hand."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def redeploy(self, topo: Topology) -> None:
        from pdctl.lifecycle.up import UpOptions, up

        up(topo, self.console, UpOptions(restart=True, smoke=False))

    def down(self, topo: Topology) -> None:
        from pdctl.lifecycle.down import down

        down(topo, self.console)
