"""Running a topology: `up`, `status`, `down` as library calls (the CLI and the bench both use these).

    up(topo, console, UpOptions(...)) -> Deployment
    status(topo, ssh=...) -> StatusReport
    down(topo, console, ssh=..., timeout=...) -> DownReport
"""

from __future__ import annotations

from pdctl.lifecycle.bringup.pipeline import Deployment, UpOptions, up
from pdctl.lifecycle.changes.down import DownReport, down
from pdctl.lifecycle.watch.status import StatusReport, status

__all__ = ["Deployment", "DownReport", "StatusReport", "UpOptions", "down", "status", "up"]
