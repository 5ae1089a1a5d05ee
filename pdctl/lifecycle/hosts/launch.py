"""Start, find, probe and stop one deployment's processes on one host.

A started process carries `PDCTL_DEPLOYMENT`, `PDCTL_NODE` and `PDCTL_PROCESS` in its environment, and so do
its children; stopping means SIGTERM to every such process and to the process groups they lead, a wait, then
SIGKILL. Nothing is ever matched by command name.
"""

from __future__ import annotations

import time
from collections.abc import Collection

import httpx

from pdctl.markers import NODE_VAR, PROCESS_VAR
from pdctl.plan import ProcessSpec
from pdctl.remote.base import Transport
from pdctl.remote.procs import DetachedJob, HostProcess, systemd_stop_script, unit_name
from pdctl.state import ProcessRecord, argv_hash

STOP_TIMEOUT_S = 20.0
POLL_S = 0.2


def job_for(spec: ProcessSpec, deployment: str) -> DetachedJob:
    env = {**spec.env, NODE_VAR: spec.node, PROCESS_VAR: spec.name}
    return DetachedJob(
        unit=unit_name(deployment, spec.name),
        argv=spec.argv,
        env=env,
        workdir=spec.workdir,
        log_path=spec.log_path,
        secret_env=spec.secret_env,
    )


def start(transport: Transport, spec: ProcessSpec, deployment: str) -> ProcessRecord:
    """Start `spec` detached on `transport`'s host; returns the record to write to the state file at once."""
    started = transport.start_detached(job_for(spec, deployment))
    return ProcessRecord(
        name=spec.name,
        role=spec.role,
        node=spec.node,
        host=spec.host,
        pid=started.pid,
        unit=started.unit,
        log_path=spec.log_path,
        ports=list(spec.ports),
        url=spec.url,
        health_url=spec.health_url,
        started_at=time.time(),
        argv_hash=argv_hash(spec),
    )


def running(transport: Transport, deployment: str, node: str) -> dict[str, list[HostProcess]]:
    """Live processes of the deployment on this node, by process name (children included)."""
    found: dict[str, list[HostProcess]] = {}
    for proc in transport.find_by_marker(deployment, node):
        found.setdefault(proc.process, []).append(proc)
    return found


def leader(procs: list[HostProcess], record: ProcessRecord | None) -> HostProcess | None:
    """The process pdctl started (recorded pid), else the group leader among those found."""
    if record is not None:
        for p in procs:
            if p.pid == record.pid:
                return p
    return next((p for p in procs if p.pid == p.pgid), procs[0] if procs else None)


def stop(
    transport: Transport,
    deployment: str,
    node: str,
    names: Collection[str] | None = None,
    *,
    units: Collection[str] = (),
    timeout: float = STOP_TIMEOUT_S,
) -> list[int]:
    """Stop the deployment's processes on this node (only `names`, when given); returns the pids signalled.

    Idempotent: nothing running is not an error.
    """
    for unit in units:
        transport.run(systemd_stop_script(unit), timeout=timeout + 10)

    def targets() -> list[HostProcess]:
        procs = transport.find_by_marker(deployment, node)
        return [p for p in procs if names is None or p.process in names]

    procs = targets()
    signalled = [p.pid for p in procs]
    for signal, wait in (("TERM", timeout), ("KILL", 10.0)):
        if not procs:
            break
        _signal(transport, procs, signal)
        deadline = time.monotonic() + wait
        while procs and time.monotonic() < deadline:
            time.sleep(POLL_S)
            procs = targets()
    return signalled


def _signal(transport: Transport, procs: list[HostProcess], signal: str) -> None:
    pids = {p.pid for p in procs}
    # Only groups led by one of ours: never a group we merely share with someone else's shell.
    groups = sorted({p.pgid for p in procs if p.pgid in pids})
    transport.signal(sorted(pids), groups, signal)


def health(transport: Transport, url: str, timeout: float = 2.0) -> str:
    """`ok`, or why not: the HTTP status, or the connection error's kind. `transport` is the host serving `url`."""
    try:
        with httpx.Client(transport=transport.http(), timeout=timeout) as client:
            resp = client.get(url)
    except httpx.TimeoutException:
        return "timeout"
    except httpx.HTTPError as exc:
        return type(exc).__name__
    return "ok" if resp.status_code == 200 else f"HTTP {resp.status_code}"
