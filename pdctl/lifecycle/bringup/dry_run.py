"""`up --dry-run`: every change `up` would make, host by host, with nothing changed anywhere.

`up`'s stages, each stopped before it changes something: connect (a host that does not answer is reported, as
`status` does), what runs on the hosts against the state file (`decision.decide`, the decision `up` itself takes), the
preflight, the engine key file, and provisioning previewed operation by operation (`provision.preview`, which
stops each operation at its first change). No lock is taken, no state file written, no process started.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rich.console import Console
from rich.markup import escape

from pdctl.errors import LaunchError
from pdctl.lb_config import server_diff
from pdctl.lifecycle.bringup.decision import NOTHING_STOPPED, decide, live_membership, refusal
from pdctl.lifecycle.bringup.pipeline import UpOptions
from pdctl.lifecycle.bringup.preflight import preflight
from pdctl.lifecycle.bringup.provision import HostPreview, preview
from pdctl.lifecycle.bringup.smoke import router_api_key
from pdctl.lifecycle.changes.lb import backends as routers_of
from pdctl.lifecycle.changes.lb import current_config, lb_spec, wanted_config
from pdctl.lifecycle.changes.live import ONE_ROUTER_RESTART
from pdctl.lifecycle.hosts import launch
from pdctl.lifecycle.hosts.connect import reachable
from pdctl.plan import ProcessSpec, engine_key_path, plan
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.remote.procs import HostProcess
from pdctl.remote.shell import expand_home
from pdctl.state import DeploymentState, StateStore
from pdctl.topology import Topology

Action = Literal["start", "restart", "stop", "keep", "reload", "reload-lb", "unknown"]
VERBS: dict[Action, str] = {
    "start": "would start", "restart": "would restart", "stop": "would stop", "keep": "running, left as it is",
    "reload": "running, would reload its members", "reload-lb": "running, would reload the load balancer",
    "unknown": "unknown (its host did not answer)",
}
LB_RELOAD = "SIGUSR2 to its master, which keeps its pid; the old worker finishes the connections it holds"
ROUTER_LEAVES = ("not in the topology: drained at the load balancer first, left out of its reloaded config, "
                 "stopped once no request is open on it")
FIRST_CHANGE_NOTE = "provisioning shows each operation's first change; more steps may follow it"


@dataclass(frozen=True)
class ProcessChange:
    name: str
    action: Action
    why: str = ""

    def describe(self) -> str:
        return f"{self.name}: {VERBS[self.action]}" + (f" ({self.why})" if self.why else "")


@dataclass
class HostDryRun:
    node: str
    processes: list[ProcessChange] = field(default_factory=list)
    provision: HostPreview | None = None  # None: `up` would not provision (nothing starts, --skip-provision)
    engine_key: str | None = None  # the key file `up` would write here
    unreachable: str | None = None
    unreachable_hint: str = ""

    @property
    def changes(self) -> int:
        ops = len(self.provision.changes) if self.provision else 0
        return ops + sum(p.action not in ("keep", "unknown") for p in self.processes) + (self.engine_key is not None)

    @property
    def failures(self) -> list[str]:
        """What `up` would stop at on this host, as it stands now."""
        if self.provision is None:
            return []
        if self.provision.error is not None:
            return [self.provision.error.message.splitlines()[0]]
        return [p.error.message.splitlines()[0] for p in self.provision.previews if p.error and not p.after_changes]


@dataclass
class DryRunReport:
    name: str
    hosts: list[HostDryRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # deployment-wide: the preflight

    @property
    def ok(self) -> bool:
        """False where `up` could not go through as things stand: a host unreachable, a check or step failing."""
        return not self.failures and all(h.unreachable is None and not h.failures for h in self.hosts)

    @property
    def changes(self) -> int:
        return sum(h.changes for h in self.hosts)

    @property
    def unreachable(self) -> list[str]:
        return [h.node for h in self.hosts if h.unreachable is not None]

    def summary(self) -> str:
        """The last line: the changes found, and where the plan is unknown because a host did not answer."""
        total = self.changes
        found = f"{total} change{'s' * (total != 1)}" if total else "no changes"
        down = self.unreachable
        if not down:
            return f"dry run: {found}, nothing changed" if total else "dry run: no changes"
        if len(down) == len(self.hosts):
            return (f"dry run: plan unknown: no host answered ({', '.join(down)}), so what `up` would change is "
                    "unknown; nothing changed")
        return (f"dry run: {found} on the hosts that answered; plan unknown on {', '.join(down)} (unreachable); "
                "nothing changed")


def dry_run(topo: Topology, options: UpOptions | None = None) -> DryRunReport:
    """What `up(topo, options)` would change, read from the hosts now; changes nothing (no lock, no state)."""
    opts = options or UpOptions()
    state = StateStore(topo.name).load() or DeploymentState(name=topo.name, topology=topo.name)
    report = DryRunReport(topo.name)
    if topo.slurm is not None:
        from pdctl.errors import SlurmError
        from pdctl.slurm.allocation import bound
        from pdctl.slurm.jobs import controller

        controller()  # without one, nothing below can be known: `up` would stop here too
        try:
            topo = bound(topo)
        except SlurmError as exc:  # no running job, so no host to ask: `up` submits (or attaches) first
            report.notes.append(f"slurm: {exc.message}: `up` would get a job first, then start every process")
            report.hosts = [HostDryRun(n.name) for n in topo.nodes]
            by_node = {h.node: h for h in report.hosts}
            for spec in plan(topo):
                by_node[spec.node].processes.append(ProcessChange(spec.name, "start"))
            return report
    specs = plan(topo)
    with reachable(topo.nodes, opts.ssh) as (hosts, failed):
        report.hosts = [HostDryRun(n.name) for n in topo.nodes]
        by_node = {h.node: h for h in report.hosts}
        for node, error in failed.items():
            by_node[node].unreachable = error.message.splitlines()[0]
            by_node[node].unreachable_hint = error.hint
        nodes = sorted({s.node for s in specs if s.node in hosts})
        live = parallel(nodes, lambda n: launch.running(hosts[n], topo.name, n))
        known = [s for s in specs if s.node in hosts]
        to_start = _processes(topo, known, state, live, opts.restart, by_node, opts.rolling, report.failures)
        _lb_reload(topo, known, hosts, by_node)
        for spec in specs:
            if spec.node in failed:
                by_node[spec.node].processes.append(ProcessChange(spec.name, "unknown"))
        if failed:
            report.notes.append("provisioning and preflight: not checked while a host is unreachable")
            return report
        if not to_start:
            report.notes.append("provisioning: not needed, nothing would start")
            return report
        try:
            preflight(topo, [s for s in to_start if not live[s.node].get(s.name)], hosts, router_api_key(topo))
        except LaunchError as exc:
            report.failures.append(exc.message)
        for node, key in _missing_keys(topo, hosts).items():
            by_node[node].engine_key = key
        if not opts.provision:
            report.notes.append("provisioning: skipped (--skip-provision)")
            return report
        for host in preview(topo, specs, hosts, allow_reboot=opts.allow_reboot):
            by_node[host.node].provision = host
    return report


def _processes(
    topo: Topology,
    specs: Sequence[ProcessSpec],
    state: DeploymentState,
    live: Mapping[str, dict[str, list[HostProcess]]],
    restart: bool,
    hosts: Mapping[str, HostDryRun],
    rolling: bool,
    failures: list[str],
) -> list[ProcessSpec]:
    """Record each process's fate on its host; returns what `up` would start (with --restart: all of them).
    A replacement `up` would refuse (a vLLM engine whose GPU memory a running peer holds) goes to `failures`."""
    if restart and not (rolling and live_membership(specs)):
        for spec in specs:
            running = bool(live[spec.node].get(spec.name))
            change = ProcessChange(spec.name, "restart", "--restart") if running else ProcessChange(spec.name, "start")
            hosts[spec.node].processes.append(change)
        names = {s.name for s in specs}
        for node, procs in live.items():
            hosts[node].processes += [ProcessChange(n, "stop", "not in the topology") for n in procs if n not in names]
        return list(specs)
    decision = decide(specs, state, live, restart and rolling, engine=topo.engine)
    held = refusal(topo, decision, restart and rolling) if decision.held and not decision.changed else None
    if held is not None:
        why = held.message.removesuffix(f". {NOTHING_STOPPED}")
        failures.append(f"{why}; `up` refuses before it stops anything ({held.hint})")
    replaced = {s.name for s in decision.replace}
    joining = [s.name for s in decision.start if s.role in ("prefill", "decode")]
    for spec in specs:
        if spec.name in decision.changed:
            why = "its argv changed" if spec.name in state.processes else "not recorded in the state file"
            change = ProcessChange(spec.name, "restart", f"{why}: `pdctl up --restart` restarts the deployment")
        elif spec.name in decision.held:
            why = "--restart --rolling" if restart else "its argv changed"
            change = ProcessChange(spec.name, "restart", f"{why}, but not live: it {decision.held[spec.name]}; "
                                   "`pdctl up --restart` restarts the deployment")
        elif spec.name in replaced:
            why = "--restart --rolling" if restart else "its argv changed"
            lb = any(s.role == "lb" for s in specs)
            how = ("drained at the load balancer first, then restarted alone, the other routers serving"
                   if spec.role == "router" and lb else ONE_ROUTER_RESTART if spec.role == "router" else
                   "drained first, then restarted alone, the others serving")
            change = ProcessChange(spec.name, "restart", f"{why}: {how}")
        elif spec.role == "router" and spec.name in decision.kept and (joining or decision.removed):
            diff = [f"+{n}" for n in joining] + [f"-{n}" for n in decision.removed]
            change = ProcessChange(spec.name, "reload", f"{' '.join(diff)}; SIGHUP, no restart")
        else:
            change = ProcessChange(spec.name, "keep" if spec.name in decision.kept else "start")
        hosts[spec.node].processes.append(change)
    for name in decision.removed:
        record = state.processes[name]
        hosts[record.node].processes.append(ProcessChange(
            name, "stop", "not in the topology: drained first (no new turns, in-flight ones finish, its handles "
            "released)"))
    for name in decision.removed_routers:
        hosts[state.processes[name].node].processes.append(ProcessChange(name, "stop", ROUTER_LEAVES))
    return decision.start


def _lb_reload(topo: Topology, specs: Sequence[ProcessSpec], hosts: Mapping[str, Transport],
               by_node: Mapping[str, HostDryRun]) -> None:
    """The running load balancer's line becomes a reload where its config would change (routers added, removed
    or moved, a conversation header): the config `up` would leave, against the one on the node now."""
    lb = lb_spec(specs)
    if lb is None:
        return
    changes = by_node[lb.node].processes
    at = next((i for i, c in enumerate(changes) if c.name == lb.name and c.action == "keep"), None)
    if at is None:
        return
    transport = hosts[lb.node]
    current = current_config(topo, transport)
    final = routers_of(specs)
    if wanted_config(topo, final, transport) != current:
        names = {b.name for b in final}
        new = any(c.action == "start" and c.name in names for h in by_node.values() for c in h.processes)
        when = "once the new routers answer; " if new else ""
        changes[at] = ProcessChange(lb.name, "reload-lb", f"{server_diff(current, final)}; {when}{LB_RELOAD}")


def _missing_keys(topo: Topology, hosts: Mapping[str, Transport]) -> dict[str, str]:
    """Nodes without the deployment's engine key file (only its presence is read, never the key)."""
    nodes = sorted({inst.node for _, _, inst in topo.instances()} | {topo.router.node})
    paths = {n: engine_key_path(topo, n) for n in nodes}
    there = parallel(nodes, lambda n: hosts[n].run(f"test -s {expand_home(paths[n])}", timeout=30.0).ok)
    return {n: paths[n] for n in nodes if not there[n]}


def render_dry_run(report: DryRunReport, console: Console) -> None:
    """The report for people: per host its changes, then what `up` would stop at."""
    for host in report.hosts:
        if host.unreachable is not None:
            console.print(f"[red]unreachable[/] {escape(host.node)}: {escape(host.unreachable)}", highlight=False)
            if host.unreachable_hint:
                console.print(f"  hint: {escape(host.unreachable_hint)}", highlight=False)
            for change in host.processes:
                console.print(f"  {escape(change.describe())}", highlight=False)
            continue
        n = host.changes
        console.print(f"[bold]{escape(host.node)}[/]: " + (f"{n} change{'s' * (n != 1)}" if n else "no changes"),
                      highlight=False)
        if host.provision is not None:
            if host.provision.error is not None:
                console.print(f"  [red]facts unreadable[/]: {escape(host.provision.error.message)}", highlight=False)
            for p in host.provision.previews:
                console.print(f"  {p.name}: {escape(p.describe())}", highlight=False)
        if host.engine_key is not None:
            console.print(f"  engine key: would write {escape(host.engine_key)}", highlight=False)
        for change in host.processes:
            console.print(f"  {escape(change.describe())}", highlight=False)
    for note in report.notes:
        console.print(escape(note), highlight=False)
    for failure in report.failures:
        console.print(f"[red]up would stop here[/]: {escape(failure)}", highlight=False)
    if any(h.provision is not None and h.provision.changes for h in report.hosts):
        console.print(FIRST_CHANGE_NOTE, highlight=False)
    console.print(escape(report.summary()), highlight=False)

