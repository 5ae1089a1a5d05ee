"""`pdctl up / status / down / logs`: thin shells over `pdctl.lifecycle`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from pdctl.cli.support import TOPOLOGY_HELP, call, err, load_topology, out
from pdctl.errors import UsageError
from pdctl.remote.shell import expand_home
from pdctl.remote.sshconnect import SshOptions

TopologyOpt = Annotated[Path | None, typer.Option("--topology", "-t", help=TOPOLOGY_HELP, show_default=False)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a topology key (dotted.key=value).")]
AcceptOpt = Annotated[
    bool, typer.Option("--accept-new-host-keys", help="Trust and record SSH host keys seen for the first time.")
]
SshConfigOpt = Annotated[
    Path | None, typer.Option("--ssh-config", help="SSH config file; default $PDCTL_SSH_CONFIG, ~/.ssh/config.")
]
KnownHostsOpt = Annotated[
    Path | None,
    typer.Option("--known-hosts", help="known_hosts file; default $PDCTL_KNOWN_HOSTS, ~/.ssh/known_hosts."),
]


def _ssh(accept: bool, config: Path | None, known: Path | None) -> SshOptions:
    return SshOptions.from_env(accept_new_host_keys=accept or None, ssh_config=config, known_hosts=known)


def up(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    restart: Annotated[bool, typer.Option("--restart", help="Stop the running deployment and start it again.")] = False,
    skip_provision: Annotated[bool, typer.Option("--skip-provision", help="Do not provision the hosts.")] = False,
    allow_reboot: Annotated[bool, typer.Option("--allow-reboot", help="Provisioning may reboot hosts.")] = False,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Seconds to wait for health.")] = None,
    no_smoke: Annotated[bool, typer.Option("--no-smoke-test", help="Skip the two-turn reuse check.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print every change `up` would make, per host; change nothing.")
    ] = False,
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """Start the deployment (decodes, prefills, router), wait for health, and prove turn 2 reuses decode's KV."""
    from pdctl.lifecycle import UpOptions
    from pdctl.lifecycle import up as do_up

    def run() -> bool:
        topo = load_topology(topology, overrides)
        opts = UpOptions(
            ssh=_ssh(accept_new_host_keys, ssh_config, known_hosts), restart=restart,
            provision=not skip_provision, allow_reboot=allow_reboot, timeout=timeout, smoke=not no_smoke,
        )
        if dry_run:
            from pdctl.lifecycle.dry_run import dry_run as do_dry_run
            from pdctl.lifecycle.dry_run import render_dry_run

            report = do_dry_run(topo, opts)
            render_dry_run(report, out)
            return report.ok
        dep = do_up(topo, err, opts)
        if dep.started:
            out.print(f"[green]up[/] {dep.name}: started {', '.join(dep.started)}", highlight=False)
        else:
            out.print(f"[green]up[/] {dep.name}: already running, no changes", highlight=False)
        out.print(f"router: {dep.router_url}", highlight=False)
        return True

    if not call(run):
        raise typer.Exit(1)


def status(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    watch: Annotated[float | None, typer.Option("--watch", help="Refresh every N seconds until Ctrl-C.")] = None,
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """Health, pids, uptime, engine KV/NIXL metrics, GPU memory and the router's reuse hit rate."""
    from pdctl.lifecycle import status as do_status
    from pdctl.lifecycle.status_view import render_status

    def run() -> bool:
        if watch is not None and not watch > 0:
            raise UsageError(f"--watch {watch:g} is not a positive number of seconds", hint="e.g. --watch 2")
        topo = load_topology(topology, overrides)
        ssh = _ssh(accept_new_host_keys, ssh_config, known_hosts)
        while True:
            report = do_status(topo, ssh=ssh)
            if as_json:
                print(json.dumps(report.to_json(), indent=2))
            else:
                if watch:
                    out.clear()
                render_status(report, out)
            if not watch:
                return report.healthy
            time.sleep(watch)

    if not call(run):
        raise typer.Exit(1)


def down(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds between SIGTERM and SIGKILL.")] = 20.0,
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """Stop router, prefills, decodes; verify nothing of the deployment runs, its ports are free, GPUs released."""
    from pdctl.lifecycle import down as do_down

    def run() -> None:
        topo = load_topology(topology, overrides)
        report = do_down(topo, err, ssh=_ssh(accept_new_host_keys, ssh_config, known_hosts), timeout=timeout)
        count = sum(len(p) for p in report.stopped.values())
        out.print(f"[green]down[/] {topo.name}: {count} process(es) stopped, nothing left running", highlight=False)

    call(run)


def logs(
    process: Annotated[str | None, typer.Argument(help="Process name (router, prefill-0, decode-0...).")] = None,
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines.")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", help="Lines from the end.")] = 50,
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """Print the log of one process (default: every process, the last lines of each)."""
    from pdctl.lifecycle.connect import connected
    from pdctl.plan import plan
    from pdctl.slurm.allocation import bound

    def run() -> None:
        topo = bound(load_topology(topology, overrides))
        specs = plan(topo)
        chosen = [s for s in specs if process is None or s.name == process]
        if not chosen:
            names = ", ".join(s.name for s in specs)
            raise UsageError(f"no process {process!r} in {topo.name}", hint=f"choose one of: {names}")
        with connected(topo.nodes, _ssh(accept_new_host_keys, ssh_config, known_hosts)) as hosts:
            for spec in chosen:
                if len(chosen) > 1:
                    err.print(f"[bold]==> {spec.name} on {spec.node}: {spec.log_path}[/]", highlight=False)
                print(hosts[spec.node].tail(spec.log_path, lines=lines), end="", flush=True)
            if follow and len(chosen) == 1:
                _follow(hosts[chosen[0].node], chosen[0].log_path)

    call(run)


def port_forward(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    port: Annotated[int | None, typer.Option("--port", help="Local port; default the router's port, 0: any free.")]
    = None,
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """Open a local port to the router (through SSH for a remote router node) until Ctrl-C."""
    import threading

    from pdctl.lifecycle.port_forward import Forwarding
    from pdctl.lifecycle.port_forward import port_forward as forward

    stop = threading.Event()

    def ready(f: Forwarding) -> None:
        out.print(f"forwarding {f.local_url} -> {f.router_url} on {f.node}; Ctrl-C to stop", highlight=False)
        out.file.flush()

    def run() -> None:
        topo = load_topology(topology, overrides)
        try:
            forward(topo, port, ready, stop, ssh=_ssh(accept_new_host_keys, ssh_config, known_hosts))
        except KeyboardInterrupt:
            stop.set()
            err.print("port-forward stopped")

    call(run)


def _follow(transport: object, path: str) -> None:
    from pdctl.remote.base import Transport

    assert isinstance(transport, Transport)
    size = int(transport.run(f"wc -c < {expand_home(path)} 2>/dev/null || echo 0").stdout.strip() or 0)
    while True:
        time.sleep(1.0)
        res = transport.run(f"tail -c +{size + 1} {expand_home(path)} 2>/dev/null")
        if res.stdout:
            print(res.stdout, end="", flush=True)
            size += len(res.stdout.encode())


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(status)
    app.command()(down)
    app.command()(logs)
    app.command("port-forward")(port_forward)
