"""`down`: stop everything of a deployment, then prove it: no process with its marker, its ports free, and on
GPU hosts no GPU memory held by it. Works without the state file and is safe to run twice.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rich.console import Console

from pdctl.errors import ConnectError, LaunchError, StateError
from pdctl.facts.base import HostLayout, layout_for, layouts_from_env, read
from pdctl.facts.gpu import GpuProcesses
from pdctl.facts.host import ListeningPorts
from pdctl.lifecycle.changes.stop import stop_all
from pdctl.lifecycle.hosts import gpu_memory, launch
from pdctl.lifecycle.hosts.connect import reachable
from pdctl.lifecycle.hosts.lock import deployment_lock
from pdctl.markers import MARKER
from pdctl.plan import ProcessSpec, plan
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.remote.sshconnect import SshOptions
from pdctl.state import StateStore
from pdctl.topology import Topology

PORT_GRACE_S = 5.0


@dataclass
class DownReport:
    name: str
    stopped: dict[str, list[int]] = field(default_factory=dict)
    state_file_found: bool = False

    @property
    def nothing_was_running(self) -> bool:
        return not any(self.stopped.values())


def down(
    topo: Topology, console: Console, *, ssh: SshOptions | None = None, timeout: float = launch.STOP_TIMEOUT_S
) -> DownReport:
    """Stop `topo`'s processes (router, prefills, decodes, then anything else carrying its marker) and verify."""
    with deployment_lock(topo.name, "down"):
        return _down(topo, console, ssh, timeout)


def _down(topo: Topology, console: Console, ssh: SshOptions | None, timeout: float) -> DownReport:
    store = StateStore(topo.name)
    try:
        state = store.load()
    except StateError as exc:
        console.print(f"[yellow]warning[/]: {exc.message}; finding processes by their marker instead")
        state = None
    report = DownReport(topo.name, state_file_found=state is not None)
    job: tuple[int, bool] | None = None
    if topo.slurm is not None:
        from pdctl.lifecycle.hosts.slurm_job import job_gone, job_status

        bound, slurm = job_status(topo, store if state is not None else None)
        if bound is None:
            job_gone(topo, slurm, console)
            _forget(store, console)
            return report
        assert slurm.jobid is not None
        topo, job = bound, (slurm.jobid, slurm.submitted_by_pdctl)
    specs = plan(topo)
    with reachable(topo.nodes, ssh) as (hosts, unreachable):
        mine = [s for s in specs if s.node in hosts]
        report.stopped = stop_all(topo, mine, hosts, state, console, timeout=timeout, stragglers=True)
        _verify(topo, mine, hosts)
        if state is not None and state.gpu_memory_before and topo.engine == "vllm":
            gpu_memory.check_back(topo, hosts, state.gpu_memory_before, console)
    if job is not None and not unreachable:
        from pdctl.lifecycle.hosts.slurm_job import release

        release(topo, *job, console)
    if unreachable:
        lines = "\n  ".join(str(e) for e in unreachable.values())
        raise ConnectError(
            ", ".join(sorted(unreachable)),
            f"could not reach the host(s) to stop their processes (the others were stopped):\n  {lines}",
            hint="bring the host back and rerun `pdctl down`; the state file is kept until then",
        )
    _forget(store, console)
    if report.nothing_was_running:
        console.print(f"{topo.name}: nothing was running")
    return report


def _forget(store: StateStore, console: Console) -> None:
    try:
        store.delete()
    except StateError as exc:  # what `down` is for is done: the deployment is stopped and verified
        console.print(f"[yellow]warning[/]: {exc.message}; {exc.hint}", highlight=False)


def _verify(topo: Topology, specs: Sequence[ProcessSpec], hosts: Mapping[str, Transport]) -> None:
    layouts = layouts_from_env()
    ports_by_node: dict[str, set[int]] = {}
    for spec in specs:
        ports_by_node.setdefault(spec.node, set()).update(spec.ports)

    def check(node: str) -> list[str]:
        transport = hosts[node]
        problems = [f"{node}: {p.process or 'pid'} {p.pid} still running" for p in
                    transport.find_by_marker(topo.name, node)]
        deadline = time.monotonic() + PORT_GRACE_S
        while True:
            listening = read(transport, ListeningPorts(), layout_for(layouts, node))
            busy = sorted(ports_by_node.get(node, set()) & set(listening))
            if not busy or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        problems += [f"{node}: port {p} still in use (by a process without the marker)" for p in busy]
        if topo.engine == "vllm":
            problems += _gpu_holders(transport, topo.name, node, layout_for(layouts, node))
        return problems

    problems = [p for found in parallel(sorted(ports_by_node), check).values() for p in found]
    if problems:
        raise LaunchError(
            f"{topo.name} is not completely down:\n  " + "\n  ".join(problems),
            hint="run `pdctl down` again; if it persists, look at the processes named above",
        )


def _gpu_holders(transport: Transport, deployment: str, node: str, layout: HostLayout) -> list[str]:
    pids = [p.pid for p in read(transport, GpuProcesses(), layout)]
    if not pids:
        return []
    marker = shlex.quote(f"{MARKER}={deployment}")
    script = "; ".join(
        f"grep -qzx {marker} /proc/{pid}/environ 2>/dev/null && echo {pid}" for pid in pids
    )
    held = transport.run(script + "; true").stdout.split()
    return [f"{node}: pid {pid} of {deployment} still holds GPU memory" for pid in held]
