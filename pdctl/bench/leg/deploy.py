"""The bench's way to (re)deploy a leg: the lifecycle library's `up` with a restart, and its `down`."""

from __future__ import annotations

from rich.console import Console

from pdctl.plan import ProcessSpec
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Topology


class LifecycleDeployer:
    """Every leg starts from scratch (router state included), as the seed's manual recipe did by hand."""

    def __init__(self, console: Console, ssh: SshOptions | None = None) -> None:
        self.console = console
        self.ssh = ssh

    def redeploy(self, topo: Topology) -> list[ProcessSpec]:
        from pdctl.lifecycle.bringup.pipeline import UpOptions, up

        return up(topo, self.console, UpOptions(ssh=self.ssh, restart=True, smoke=False)).specs

    def down(self, topo: Topology) -> None:
        from pdctl.lifecycle.changes.down import down

        down(topo, self.console, ssh=self.ssh)
