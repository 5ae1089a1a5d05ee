"""`up`'s live changes to the routers behind the load balancer (`router.replicas` > 1), with nothing else
restarted: new routers are started (by `up`) and healthy before HAProxy is reloaded with them; a router no longer
in the topology is drained at HAProxy, left out of the reloaded config, and stopped by its pid once no request is
open on it. A reload is SIGUSR2 to HAProxy's master (pdctl.lifecycle.changes.lb.reload): its pid stays, a new
worker takes the listeners and the old one finishes the connections it holds.

The config HAProxy gets is always built from the routers as they run now (their records in the state file), so a
router restarted on another port (`router.replica_port` changed) is reloaded in as soon as it answers.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence

from rich.console import Console

from pdctl.errors import LaunchError
from pdctl.lb_config import Backend, server_diff
from pdctl.lifecycle.changes import lb as balancer
from pdctl.lifecycle.changes import membership
from pdctl.lifecycle.hosts import launch
from pdctl.plan import ProcessSpec
from pdctl.remote.base import Transport
from pdctl.state import DeploymentState, ProcessRecord, StateStore
from pdctl.topology import Topology

POLL_S = 0.2


def running_backends(specs: Sequence[ProcessSpec], state: DeploymentState,
                     leaving: Collection[str] = ()) -> list[Backend]:
    """The planned routers where they run now (their records), in plan order; `leaving` ones left out."""
    records = [state.processes.get(s.name) for s in balancer.routers(specs) if s.name not in leaving]
    return [Backend(r.name, r.host, r.ports[0]) for r in records if r is not None]


def sync(topo: Topology, specs: Sequence[ProcessSpec], hosts: Mapping[str, Transport], state: DeploymentState,
         console: Console, leaving: Collection[str] = ()) -> str | None:
    """Reload the running load balancer where its config differs from the one for the routers that run now;
    waits until HAProxy sees every one of them UP. Returns what changed ("+router-2"), None where nothing did."""
    lb = balancer.lb_spec(specs)
    if lb is None or lb.name not in state.processes:
        return None
    transport = hosts[lb.node]
    now = running_backends(specs, state, leaving)
    text = balancer.wanted_config(topo, now, transport)
    current = balancer.current_config(topo, transport)
    if text == current:
        return None
    diff = server_diff(current, now)
    console.print(f"reloading the load balancer ({diff}): its old worker finishes the connections it holds",
                  highlight=False)
    balancer.install_config(topo, text, transport)
    balancer.reload(topo, transport, state.processes[lb.name])
    for b in now:
        balancer.wait_state(topo, transport, b.name, "UP")
    return diff


def apply(topo: Topology, specs: Sequence[ProcessSpec], hosts: Mapping[str, Transport], store: StateStore,
          state: DeploymentState, console: Console, removed: Sequence[str], timeout: float) -> list[str]:
    """After the new routers answer: drain the removed ones at HAProxy, reload it for the routers that stay (and
    the new ones), then stop each removed router once nothing is open on it. Returns what changed."""
    lb = balancer.lb_spec(specs)
    if lb is None or lb.name not in state.processes:
        return []
    transport = hosts[lb.node]
    for name in removed:
        console.print(f"removing {name}: draining it at the load balancer (no new conversations)", highlight=False)
        balancer.set_state(topo, transport, name, "drain")
        balancer.wait_idle(topo, transport, name, timeout)
    diff = sync(topo, specs, hosts, state, console, leaving=removed)
    done = [f"load balancer reloaded ({diff})"] if diff else []
    for name in removed:
        record = state.processes[name]
        wait_router_idle(hosts[record.node], record, timeout)
        stop(topo, hosts, record, console)
        store.forget(state, name)
        done.append(f"{name} removed")
    return done


def in_flight(transport: Transport, router_url: str) -> int | None:
    """Requests the router has open on its engines now (its /stats), None where it does not answer."""
    s = membership.stats(transport, router_url)
    return None if s is None else sum(u.outstanding for u in (*s.prefill, *s.decode))


def wait_router_idle(transport: Transport, record: ProcessRecord, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    left: int | None = None
    while time.monotonic() < deadline:
        left = in_flight(transport, record.url)
        if left == 0 or (left is None and launch.health(transport, record.health_url) != "ok"):  # it died
            return
        time.sleep(POLL_S)
    raise LaunchError(f"{record.name} still has {left} request(s) open after {timeout:g}s; the load balancer no "
                      "longer sends it any, and it is still running",
                      hint="`pdctl up` again waits again; `pdctl up --timeout <s>` waits longer")


def stop(topo: Topology, hosts: Mapping[str, Transport], record: ProcessRecord, console: Console) -> None:
    pids = launch.stop(hosts[record.node], topo.name, record.node, [record.name],
                       units=[record.unit] if record.unit else [])
    console.print(f"stopped {record.name} on {record.node} ({len(pids)} processes)", highlight=False)
