"""`up`'s live changes under a running router: engines leave (drained, then stopped) and are replaced in place
(drained, stopped, started, back in) one at a time, and the router learns each change from its members file and
a SIGHUP (pdctl.lifecycle.changes.membership); nothing that did not change is restarted.

A vLLM engine whose GPU memory a running peer may hold (one GPU shared, or one node's engines over UCX cuda_ipc)
is never replaced here: `up` refuses it before anything stops (pdctl.lifecycle.bringup.decision.gpu_peers). A
replacement that does not become healthy is stopped again, and the error says what serves meanwhile.

A drain: the router takes no new turn to the engine, its in-flight streams finish, and (a decode) the router
releases the handles it holds there; only then is the engine stopped.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rich.console import Console

from pdctl.errors import LaunchError
from pdctl.lifecycle.changes import lb as balancer
from pdctl.lifecycle.changes import membership, routers_live
from pdctl.lifecycle.hosts import launch
from pdctl.lifecycle.hosts.wait import HealthCheck, wait_healthy
from pdctl.plan import ProcessSpec, members_path
from pdctl.remote.base import Transport
from pdctl.state import DeploymentState, ProcessRecord, StateStore
from pdctl.topology import Topology


class Member(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def url(self) -> str: ...


ONE_ROUTER_RESTART = ("its in-flight requests end and the handles it holds are dropped (each conversation's next "
                      "turn misses once); with router.replicas >= 2 routers restart one at a time, drained first")


@dataclass(frozen=True)
class Changes:
    replace: list[ProcessSpec] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)


def _routers(specs: Sequence[ProcessSpec]) -> list[ProcessSpec]:
    return [s for s in specs if s.role == "router" and "--members-file" in s.argv]


def _engines(specs: Sequence[Member]) -> list[Member]:
    return [s for s in specs if s.role in ("prefill", "decode")]


def _file(members: Sequence[Member], draining: Collection[str]) -> membership.Members:
    urls = {m.name: m.url for m in members}
    return membership.Members(
        prefill=tuple(m.url for m in members if m.role == "prefill"),
        decode=tuple(m.url for m in members if m.role == "decode"),
        draining=frozenset(urls[n] for n in draining if n in urls),
    )


def write_members(topo: Topology, specs: Sequence[ProcessSpec], hosts: Mapping[str, Transport],
                  state: DeploymentState, removed: Sequence[str]) -> None:
    """The members file as `up` starts (or reloads) the router: the planned engines, the removed ones draining."""
    leaving: list[Member] = [state.processes[n] for n in removed]
    m = _file([*_engines(specs), *leaving], removed)
    for node in sorted({r.node for r in _routers(specs)}):
        membership.write(hosts[node], members_path(topo, node), m)


def converge(topo: Topology, specs: Sequence[ProcessSpec], hosts: Mapping[str, Transport], store: StateStore,
             state: DeploymentState, console: Console, changes: Changes, timeout: float,
             check: HealthCheck) -> list[str]:
    """After the router is up: reload it, drain and stop the removed engines, replace the changed ones; returns
    what changed ("decode-1 removed")."""
    routers = _routers(specs)
    if not routers:
        return []
    done: list[str] = []
    engines = _engines(specs)
    lb = balancer.lb_spec(specs)

    def publish(members: Sequence[Member], draining: Collection[str] = (), leaving: Collection[str] = ()) -> None:
        m = _file(members, draining)
        for node in sorted({r.node for r in routers}):
            membership.write(hosts[node], members_path(topo, node), m)
        for r in routers:
            membership.reload(hosts[r.node], state.processes[r.name])
        for r in routers:
            membership.wait_applied(hosts[r.node], r.url, m, leaving)

    def wait_drained(url: str) -> None:
        for r in routers:
            membership.wait_drained(hosts[r.node], r.url, url, timeout)

    restarting = [s for s in changes.replace if s.role == "router"]
    for router in restarting:
        # first, so that what follows talks to routers that read their members file (an older one might not: a
        # SIGHUP would end it); each reads the file written before it at start
        record = state.processes[router.name]
        if lb is not None:
            console.print(f"restarting {router.name} behind the load balancer: draining it first", highlight=False)
            balancer.set_state(topo, hosts[lb.node], router.name, "drain")
            balancer.wait_idle(topo, hosts[lb.node], router.name, timeout)
        else:
            console.print(f"restarting the router (its settings changed): {ONE_ROUTER_RESTART}", highlight=False)
        _stop(topo, hosts, record, console)
        store.record(state, launch.start(hosts[router.node], router, topo.name))
        wait_healthy([router], hosts, topo.name, console, timeout=timeout, check=check)
        # a router restarted on another node or port is reloaded into HAProxy (a fresh worker has it ready)
        if lb is not None and routers_live.sync(topo, specs, hosts, state, console) is None:
            balancer.set_state(topo, hosts[lb.node], router.name, "ready")
            balancer.wait_state(topo, hosts[lb.node], router.name, "UP")
        done.append(f"{router.name} restarted")
    gone = gone_of(state, changes)
    fresh = {*changes.started, *(r.name for r in restarting)}
    if not all(r.name in fresh for r in routers):
        publish([*engines, *gone], changes.removed)
    for rec in gone:
        console.print(f"draining {rec.name} ({rec.url}): no new turns, in-flight ones finish", highlight=False)
        wait_drained(rec.url)
        _stop(topo, hosts, rec, console)
        store.forget(state, rec.name)
        done.append(f"{rec.name} removed")
    if gone:
        publish(engines, leaving={g.url for g in gone})
    for spec in [s for s in changes.replace if s.role != "router"]:
        old = state.processes[spec.name]
        current: list[Member] = [old if e.name == spec.name else e for e in engines]
        console.print(f"replacing {spec.name}: draining it first", highlight=False)
        publish(current, [spec.name])
        wait_drained(old.url)
        _stop(topo, hosts, old, console)
        new = launch.start(hosts[spec.node], spec, topo.name)
        store.record(state, new)
        console.print(f"started {spec.name} on {spec.node} (pid {new.pid}), log {spec.log_path}", highlight=False)
        try:
            wait_healthy([spec], hosts, topo.name, console, timeout=timeout, check=check)
        except LaunchError as exc:
            error = _not_replaced(topo, hosts, store, state, console, spec, engines, exc)
            publish(engines)  # a member again, not draining: the router finds it down, and back once it serves
            raise error from None
        publish(engines, leaving={old.url} - {spec.url})
        done.append(f"{spec.name} replaced")
    return done


def _not_replaced(topo: Topology, hosts: Mapping[str, Transport], store: StateStore, state: DeploymentState,
                  console: Console, spec: ProcessSpec, engines: Sequence[Member], exc: LaunchError) -> LaunchError:
    """A replacement that did not become healthy is stopped and forgotten (the next `up` starts it again, rather
    than keeping a process that never served); the error says what serves meanwhile and what to run."""
    _stop(topo, hosts, state.processes[spec.name], console)
    store.forget(state, spec.name)
    others = [e.name for e in engines if e.role == spec.role and e.name != spec.name]
    left = (f"{', '.join(others)} serve{'s' * (len(others) == 1)} its role meanwhile" if others else
            f"the deployment has no {spec.role} now: the router answers 503 until one is healthy")
    return LaunchError(
        f"{spec.name}'s replacement did not become healthy, so it is stopped again ({left}): {exc.message}",
        hint=f"read its log (`pdctl logs -t {topo.file} {spec.name}`); `pdctl up` with the setting fixed (or as it "
             "was) starts it again, the rest left running",
    )


def gone_of(state: DeploymentState, changes: Changes) -> list[ProcessRecord]:
    return [state.processes[n] for n in changes.removed]


def _stop(topo: Topology, hosts: Mapping[str, Transport], rec: ProcessRecord, console: Console) -> None:
    pids = launch.stop(hosts[rec.node], topo.name, rec.node, [rec.name], units=[rec.unit] if rec.unit else [])
    console.print(f"stopped {rec.name} on {rec.node} ({len(pids)} processes)", highlight=False)
