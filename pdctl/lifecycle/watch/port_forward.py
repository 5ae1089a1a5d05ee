"""`port-forward`: a local port to the router, through the router node's transport, until interrupted."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from pdctl.errors import LaunchError
from pdctl.lifecycle.hosts.connect import connected
from pdctl.lifecycle.hosts.launch import health
from pdctl.plan import entry, plan
from pdctl.remote import forward
from pdctl.remote.here import listens_here
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Topology


@dataclass(frozen=True)
class Forwarding:
    local_url: str
    router_url: str
    node: str


def port_forward(topo: Topology, port: int | None, on_ready: Callable[[Forwarding], None],
                 stop: threading.Event, *, ssh: SshOptions | None = None) -> None:
    """Serve `127.0.0.1:port` (default: the router's port) until `stop` is set; LaunchError when it is not up."""
    from pdctl.slurm.allocation import bound

    topo = bound(topo)
    router = entry(plan(topo))  # the load balancer in front of several routers
    with connected([topo.node(router.node)], ssh) as hosts:
        transport = hosts[router.node]
        verdict = health(transport, router.health_url, timeout=5.0)
        if verdict != "ok":
            raise LaunchError(
                f"{topo.name} is not up: the router at {router.url} on {router.node} does not answer ({verdict})",
                hint=f"start it with `pdctl up -t {topo.file}`, or see `pdctl status -t {topo.file}`",
            )
        target = urlsplit(router.url)
        if port is None and listens_here(transport, target.hostname or ""):
            port = 0  # the router itself holds its port on this machine: any free one
        listener = forward.listen(topo.router.port if port is None else port)
        local = f"http://127.0.0.1:{listener.getsockname()[1]}"
        on_ready(Forwarding(local, router.url, router.node))
        forward.serve(listener, transport, target.hostname or "", target.port or 80, stop)
