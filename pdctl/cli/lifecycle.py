"""`pdctl up / status / down / logs / port-forward`: thin shells over `pdctl.lifecycle`."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from pdctl.cli.complete import process_names
from pdctl.cli.options import AcceptOpt, JsonOpt, KnownHostsOpt, SetOpt, SshConfigOpt, TopologyOpt, ssh_options
from pdctl.cli.output import err, out, print_json, say
from pdctl.cli.support import load_topology
from pdctl.errors import UsageError
from pdctl.plan import ProcessSpec


def up(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    restart: Annotated[bool, typer.Option("--restart", help="Stop the running deployment and start it again.")] = False,
    rolling: Annotated[bool, typer.Option(
        "--rolling", help="With --restart: one process at a time, each drained first (no new turns, its streams "
        "finish), the others serving.")] = False,
    skip_provision: Annotated[bool, typer.Option("--skip-provision", help="Do not provision the hosts.")] = False,
    allow_reboot: Annotated[bool, typer.Option("--allow-reboot", help="Provisioning may reboot hosts.")] = False,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", help="Seconds to wait for health.", show_default="1800 with engine vllm, 120 with sim")] = None,
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

    topo = load_topology(topology, overrides, noted=True)
    opts = UpOptions(
        ssh=ssh_options(accept_new_host_keys, ssh_config, known_hosts), restart=restart,
        rolling=rolling, provision=not skip_provision, allow_reboot=allow_reboot, timeout=timeout, smoke=not no_smoke,
    )
    if dry_run:
        from pdctl.lifecycle.bringup.dry_run import dry_run as do_dry_run
        from pdctl.lifecycle.bringup.dry_run import render_dry_run

        report = do_dry_run(topo, opts)
        render_dry_run(report, out)
        if not report.ok:
            raise typer.Exit(1)
        return
    dep = do_up(topo, err, opts)
    if dep.started or dep.changed:
        done = [f"started {', '.join(dep.started)}"] if dep.started else []
        done += [f"live: {', '.join(dep.changed)}"] if dep.changed else []
        out.print(f"[green]up[/] {dep.name}: {'; '.join(done)}", highlight=False)
    else:
        out.print(f"[green]up[/] {dep.name}: already running, no changes", highlight=False)
    out.print(f"router: {dep.router_url}", highlight=False)


def status(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    as_json: JsonOpt = False,
    watch: Annotated[float | None, typer.Option("--watch", help="Refresh every N seconds until Ctrl-C.")] = None,
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """Health, pids, uptime, engine KV/NIXL metrics, GPU memory and the router's reuse hit rate."""
    from pdctl.lifecycle import status as do_status
    from pdctl.lifecycle.watch.status_view import render_status

    if watch is not None and not watch > 0:
        raise UsageError(f"--watch {watch:g} is not a positive number of seconds", hint="e.g. --watch 2")
    topo = load_topology(topology, overrides)
    ssh = ssh_options(accept_new_host_keys, ssh_config, known_hosts)
    while True:
        report = do_status(topo, ssh=ssh)
        if as_json:
            print_json(report.to_json())
        else:
            if watch:
                out.clear()
            render_status(report, out)
        if not watch:
            break
        time.sleep(watch)
    if report.not_running and not as_json:
        err.print(f"hint: start it with `pdctl up -t {topo.file}`", highlight=False)
    if not report.healthy:
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

    topo = load_topology(topology, overrides)
    report = do_down(topo, err, ssh=ssh_options(accept_new_host_keys, ssh_config, known_hosts), timeout=timeout)
    count = sum(len(p) for p in report.stopped.values())
    out.print(f"[green]down[/] {topo.name}: {count} process(es) stopped, nothing left running", highlight=False)


class _Printed:
    """`pdctl logs` output: each log's text on stdout as it comes, the `==>` headers between logs on stderr."""

    def section(self, spec: ProcessSpec) -> None:
        err.print(f"[bold]==> {spec.name} on {spec.node}: {spec.log_path}[/]", highlight=False)

    def write(self, text: str) -> None:
        print(text, end="", flush=True)


def logs(
    process: Annotated[str | None, typer.Argument(help="Process name (router, prefill-0, decode-0...).",
                                                  autocompletion=process_names)] = None,
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines (one process).")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", help="Lines from the end.")] = 50,
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """Print the log of one process (default: every process, the last lines of each)."""
    from pdctl.lifecycle.watch.logs import logs as show_logs

    topo = load_topology(topology, overrides)
    ssh = ssh_options(accept_new_host_keys, ssh_config, known_hosts)
    show_logs(topo, _Printed(), process=process, lines=lines, follow=follow, ssh=ssh)


def port_forward(
    topology: TopologyOpt = None,
    overrides: SetOpt = None,
    port: Annotated[int | None, typer.Option(
        "--port", help="Local port; default the router's port (a router on this machine: any free); 0: any free.",
    )] = None,
    accept_new_host_keys: AcceptOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
) -> None:
    """Open a local port to the router (through SSH for a remote router node) until Ctrl-C."""
    import threading

    from pdctl.lifecycle.watch.port_forward import Forwarding
    from pdctl.lifecycle.watch.port_forward import port_forward as forward

    stop = threading.Event()

    def ready(f: Forwarding) -> None:
        say(out, f"forwarding {f.local_url} -> {f.router_url} on {f.node}; Ctrl-C to stop")
        out.file.flush()

    topo = load_topology(topology, overrides)
    try:
        forward(topo, port, ready, stop, ssh=ssh_options(accept_new_host_keys, ssh_config, known_hosts))
    except KeyboardInterrupt:  # Ctrl-C is how a forwarding ends: not an interruption
        stop.set()
        err.print("port-forward stopped")


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(status)
    app.command()(down)
    app.command()(logs)
    app.command("port-forward")(port_forward)
