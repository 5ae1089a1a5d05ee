"""Running a topology: `up`, `status`, `down` as library calls (the CLI and the bench both use these).

    up(topo, console, UpOptions(...)) -> Deployment
    status(topo, ssh=...) -> StatusReport
    down(topo, console, ssh=..., timeout=...) -> DownReport
"""

from __future__ import annotations

from pdctl.lifecycle.down import DownReport, down
from pdctl.lifecycle.status import StatusReport, status
from pdctl.lifecycle.up import Deployment, UpOptions, up

__all__ = ["Deployment", "DownReport", "StatusReport", "UpOptions", "down", "status", "up"]
