"""Stopping a deployment's processes in order: the load balancer, routers, prefills, decodes, then stragglers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Console

from pdctl.lifecycle.hosts import launch
from pdctl.plan import ProcessSpec
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.state import DeploymentState
from pdctl.topology import Topology

ORDER = ("lb", "router", "prefill", "decode")


def stop_all(
    topo: Topology,
    specs: Sequence[ProcessSpec],
    hosts: Mapping[str, Transport],
    state: DeploymentState | None,
    console: Console,
    *,
    timeout: float = launch.STOP_TIMEOUT_S,
    stragglers: bool = False,
) -> dict[str, list[int]]:
    """Stop `specs` role by role (hosts in parallel within a role); with `stragglers`, then every other process
    carrying the deployment's marker on every node. Returns the signalled pids by node."""
    signalled: dict[str, list[int]] = {}
    records = state.processes if state else {}
    for role in ORDER:
        group = [s for s in specs if s.role == role]
        by_node: dict[str, list[str]] = {}
        for spec in group:
            by_node.setdefault(spec.node, []).append(spec.name)

        def one(node: str, wanted: list[str]) -> list[int]:
            units = [r.unit for n, r in records.items() if n in wanted and r.node == node and r.unit]
            return launch.stop(hosts[node], topo.name, node, wanted, units=units, timeout=timeout)

        done = parallel(sorted(by_node), lambda node, names=by_node: one(node, names[node]))  # type: ignore[misc]
        for node, pids in done.items():
            signalled.setdefault(node, []).extend(pids)
            if pids:
                console.print(f"stopped {', '.join(by_node[node])} on {node} ({len(pids)} processes)")
    if stragglers:
        nodes = sorted({n.name for n in topo.nodes if n.name in hosts})
        rest = parallel(nodes, lambda n: launch.stop(hosts[n], topo.name, n, None, timeout=timeout))
        for node, pids in rest.items():
            signalled.setdefault(node, []).extend(pids)
            if pids:
                console.print(f"stopped {len(pids)} more process(es) of {topo.name} on {node} (found by marker)")
    return signalled
